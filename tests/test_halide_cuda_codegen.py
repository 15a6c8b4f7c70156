"""SMELT_CUDA_BACKEND=halide without a GPU: the pipelines smelt prints for CUDA compile for a CUDA
target, and the shared CUDA runtime links with smelt's shim in place of Halide's context hooks.

Each graph runs on the CPU through the Halide CPU backend (checked against eager); on the way,
each kernel is also generated with the GPU schedule and compiled for CUDA."""
import os
import subprocess

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.smelt_only, pytest.mark.cpu_backend_independent]

if os.environ.get("SMELT_TEST_DEVICE", "cpu") != "cpu":
    pytest.skip("compiles CUDA kernels from CPU graphs", allow_module_level=True)

import smelt  # noqa: E402,F401
import smelt.pipeline  # noqa: E402
from smelt.codegen.halide import backend as halide_backend  # noqa: E402
from smelt.runtime import halide_cuda_compile  # noqa: E402

H100 = (9, 0)


@pytest.fixture(scope="module")
def cache_folder(tmp_path_factory):
    """One cache folder for the file: the CPU and CUDA runtimes (with the shim, 3-4 s of each test)
    are built once; kernels are generated at every compile whatever the folder holds."""
    return tmp_path_factory.mktemp("halide_cuda_cache")


@pytest.fixture
def cuda_sources(monkeypatch, cache_folder):
    """Runs on the CPU backend; returns {kernel name: (CUDA source, compiled library path)}."""
    tmp_path = cache_folder
    monkeypatch.setenv("SMELT_CPU_BACKEND", "halide")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    original = halide_backend.generate_halide_kernel
    found = {}

    def also_for_cuda(step, graph, index, gpu=False, **options):
        kernel = original(step, graph, index, True, **options)
        library, _, _ = halide_cuda_compile.kernel_library(kernel.name, kernel.source, str(tmp_path), H100)
        found[kernel.name] = (kernel.source, library)
        return original(step, graph, index, gpu, **options)

    monkeypatch.setattr(halide_backend, "generate_halide_kernel", also_for_cuda)
    torch._dynamo.reset()
    yield found
    torch._dynamo.reset()


def run_both(fn, *args, tol=1e-5):
    actual = torch.compile(fn, backend="smelt", fullgraph=True)(*args)
    torch.testing.assert_close(actual, fn(*args), atol=tol, rtol=tol, equal_nan=True)


CASES = {
    "pointwise": (lambda x, y: torch.sigmoid(x) * y + torch.tanh(x - y), (torch.randn(1031), torch.randn(1031))),
    "softmax": (lambda x: torch.softmax(x, -1), (torch.randn(37, 1000),)),
    "column_sum": (lambda x: x.sum(0), (torch.randn(100, 37),)),
    "argmax": (lambda x: x.argmax(-1), (torch.randn(13, 301),)),
    "var_mean": (lambda x: torch.var_mean(x, -1), (torch.randn(13, 301),)),
    "layer_norm": (lambda x: F.layer_norm(x, (300,)), (torch.randn(9, 300),)),
    "cumsum": (lambda x: x.cumsum(-1), (torch.randn(7, 100),)),
    "transpose": (lambda x: x.t().contiguous() + 1, (torch.randn(65, 33),)),
    "gather": (lambda x, i: x[i] * 2, (torch.randn(100, 7), torch.randint(0, 100, (50,)))),
    "index_add": (lambda x, i, v: x.index_add(0, i, v), (torch.randn(10, 4), torch.randint(0, 10, (30,)),
                                                         torch.randn(30, 4))),
    "bf16": (lambda x: (x * 2).sigmoid(), (torch.randn(1000, dtype=torch.bfloat16),)),
}


@pytest.mark.parametrize("case", CASES)
def test_every_kernel_compiles_for_cuda(case, cuda_sources):
    fn, args = CASES[case]
    run_both(fn, *args, tol=1e-2 if args[0].dtype == torch.bfloat16 else 1e-5)
    assert cuda_sources
    for name, (source, library) in cuda_sources.items():
        assert "DEVICE = 'cuda'" in source and "gpu_" in source, name
        assert "hl.require" not in source and "hl.BFloat" not in source, name
        assert os.path.getsize(library) > 0


def test_bfloat16_is_bits_on_the_gpu(cuda_sources):
    run_both(lambda x: x * 3 + 1, torch.randn(513, dtype=torch.bfloat16), tol=1e-2)
    (source, _), = cuda_sources.values()
    assert "hl.ImageParam(hl.UInt(16)" in source and "f32_to_bf16_bits(" in source


def test_contiguous_rows_reduce_one_block_per_row(cuda_sources):
    run_both(lambda x: x.sum(-1), torch.randn(5, 3000))
    (source, _), = cuda_sources.values()
    assert "gpu_blocks(x)" in source and "gpu_threads(r)" in source


def test_bf16_bit_conversion_rounds_as_torch():
    """The helpers BF16_HELPERS prints, run through Halide's JIT on the CPU against torch's rounding."""
    import halide as hl
    import numpy
    from smelt.codegen.halide.gpu_schedule import BF16_HELPERS
    namespace = {"hl": hl}
    exec(BF16_HELPERS, namespace)
    values = torch.cat([torch.randn(4096) * 1e3, torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"),
                                                              3.4e38, 1e-40, 1.00390625, 1.01171875])])
    data = hl.Buffer(values.numpy())
    x = hl.Var("x")
    rounded = hl.Func("rounded")
    rounded[x] = namespace["bf16_bits_to_f32"](namespace["f32_to_bf16_bits"](data[x]))
    actual = torch.from_numpy(numpy.asarray(rounded.realize([len(values)])))
    expected = values.bfloat16().float()
    torch.testing.assert_close(actual, expected, atol=0, rtol=0, equal_nan=True)


def test_runtime_links_the_shim_over_halides_context_hooks(tmp_path):
    library = halide_cuda_compile.runtime_library(str(tmp_path))
    symbols = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True).stdout
    for hook in ("halide_cuda_acquire_context", "halide_cuda_release_context", "halide_cuda_get_stream",
                 "halide_cuda_get_symbol", "halide_get_gpu_device"):
        kinds = {line.split()[1] for line in symbols.splitlines() if line.endswith(" " + hook)}
        assert kinds == {"T"}, (hook, kinds)  # the shim's strong definition, not Halide's weak one
    assert " halide_cuda_run" in symbols


def test_capability_older_than_halide_knows_is_a_clear_error():
    from smelt.errors import KernelCompileError
    with pytest.raises(KernelCompileError, match="capability 5.0 or newer, not 3.5"):
        halide_cuda_compile.capability_feature((3, 5))
    assert "CUDACapability86" in str(halide_cuda_compile.capability_feature((9, 0)))
