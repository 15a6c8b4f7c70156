"""A GPU kernel's @triton.jit function is imported only when no kept binary launches it
(loader.DeferredKernel): a warm start loads hundreds of kernels from kept binaries, and building each
JITFunction parses its source. Compiled for sm_90 on the CPU (no GPU needed)."""
import sys

import pytest

from smelt.errors import KernelCompileError
from smelt.runtime.kernel_binaries import KernelVariants
from smelt.runtime.loader import DeferredKernel, source_path

SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def doubled_kernel(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, xmask) * 2, xmask)
'''
SPEC = (("ptr", "torch.float32", True), ("ptr", "torch.float32", True), ("i32", False))


def _deferred(path: str) -> DeferredKernel:
    return DeferredKernel(path, "doubled_kernel", lambda e: KernelCompileError(f"doubled_kernel did not load: {e}"))


def _module_name(path: str) -> str:
    return "smelt_generated_" + path.rsplit("/", 1)[-1][:-3]


def test_a_kept_binary_launches_without_importing_the_kernel(tmp_path):
    path = source_path(str(tmp_path), "doubled_kernel", SOURCE)
    first = _deferred(path)
    made = KernelVariants(first, SOURCE, str(tmp_path)).load_or_compile(SPEC, {"XBLOCK": 128}, 4, (9, 0))
    assert first._fn is not None and _module_name(path) in sys.modules  # compiled: imported
    del sys.modules[_module_name(path)]
    second = _deferred(path)  # a later process: the binary is kept
    kept = KernelVariants(second, SOURCE, str(tmp_path)).load_or_compile(SPEC, {"XBLOCK": 128}, 4, (9, 0))
    assert kept.cubin == made.cubin
    assert second._fn is None, "the kept binary's launch imported the kernel"


def test_a_kernel_that_does_not_import_says_so_at_its_first_use(tmp_path):
    path = source_path(str(tmp_path), "doubled_kernel", SOURCE.replace("tl.store(", "tl.store(("))
    deferred = _deferred(path)
    with pytest.raises(KernelCompileError, match="doubled_kernel did not load: .*SyntaxError|was never closed"):
        KernelVariants(deferred, SOURCE, None).load_or_compile(SPEC, {"XBLOCK": 128}, 4, (9, 0))


def test_a_gpu_kernel_imported_while_the_interpreter_knob_is_on_still_compiles(tmp_path):
    # Triton's interpreter knob is process-wide, and a CPU kernel's import turns it on: a GPU kernel
    # first launched meanwhile (on another thread) must still get a compiled @triton.jit function.
    import triton
    from triton.runtime.jit import JITFunction

    from smelt.runtime.loader import interpreter_mode
    deferred = _deferred(source_path(str(tmp_path), "doubled_kernel", SOURCE))
    with interpreter_mode(True):
        fn = deferred.get()
        assert triton.knobs.runtime.interpret  # given back as it was
    assert isinstance(fn, JITFunction), type(fn)
