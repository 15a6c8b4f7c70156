"""How a Triton kernel's GeneratedKernel becomes what the wrapper calls: its module imported (under
the interpreter for CPU kernels), wrapped in a launcher with its autotuner, binaries and checks."""
from __future__ import annotations

from ..artifact import GeneratedKernel
from ..errors import KernelCompileError
from .autotune import Autotuner
from .combo_launcher import ComboLauncher
from .cuda_binary import compile_options, keep_launcher_in
from .cuda_compile_check import CudaCompileCheck
from .kernel_binaries import KernelVariants
from .launcher import TritonLauncher
from .loader import load_module, source_path


def load(kernel: GeneratedKernel, path: str, cache_dir: str, keep_kernels: bool):
    try:
        module = load_module(path, interpret=kernel.interpret)
    except Exception as e:
        raise KernelCompileError(f"smelt: kernel {kernel.name} did not load; source: {path}; from ATen ops: "
                                 f"{', '.join(kernel.origins)}; error: {type(e).__name__}: {e}") from e
    fn = getattr(module, kernel.name)
    tuner = Autotuner(kernel.source, list(kernel.candidates), cache_dir) if len(kernel.candidates) > 1 else None
    variants = None if kernel.interpret else KernelVariants(fn, kernel.source, cache_dir if keep_kernels else None)
    if not kernel.interpret:
        keep_launcher_in(cache_dir)  # the C launcher is kept there whether kernels are or not
    check = None
    if kernel.cuda_twin is not None:  # SMELT_CHECK_CUDA_COMPILE
        twin_path = source_path(cache_dir, kernel.cuda_twin.name, kernel.cuda_twin.source)
        check = CudaCompileCheck(kernel.cuda_twin, twin_path, list(kernel.origins), cache_dir if keep_kernels else None)
    if kernel.combo:  # tuned by its ComboLauncher, which builds the tables each config needs
        programs = ComboLauncher.programs(kernel.combo, kernel.config.XBLOCK)
        launcher = TritonLauncher(fn, kernel.name, path, list(kernel.origins), kernel.config, kernel.interpret,
                                  kernel.xnumel_arg, variants=variants, programs=programs, cuda_check=check,
                                  options=compile_options(kernel.source))
        return ComboLauncher(launcher, *kernel.combo, autotuner=tuner)
    return TritonLauncher(fn, kernel.name, path, list(kernel.origins), kernel.config, kernel.interpret,
                          kernel.xnumel_arg, kernel.workspace, tuner, variants, kernel.ticket, cuda_check=check,
                          options=compile_options(kernel.source))
