"""Host scalars in GPU graphs, generated on the CPU from fake CUDA tensors (no GPU needed):
what the wrapper and kernels say, and that the kernels compile for sm_90 with a float64 argument.
tests/test_host_scalars.py runs them against eager on the GPU."""
import torch
from functorch.compile import aot_function, make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode

import smelt
from smelt.decompositions import decomposition_table
from smelt.pipeline import generate_graph
from smelt.runtime.kernel_binaries import KernelVariants
from smelt.runtime.launcher import appended_description, block_constants
from smelt.runtime.loader import load_module


def _gpu_graph(fn, *specs):
    """smelt's generated graph of fn's functional (AOTAutograd) graph on fake tensors of `specs`
    (shape, dtype, device), input mutations kept in the graph as Dynamo keeps them."""
    graphs = []

    def capture(gm, inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)
    with FakeTensorMode():
        args = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device in specs]
        aot_function(fn, fw_compiler=capture, decompositions=decomposition_table(),
                     keep_inference_input_mutations=True)(*args)
    with smelt.config.override(cuda_backend="triton"):
        return generate_graph(graphs[0], "inference", smelt.config.current())


def _rms_norm(x, eps, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_a_norms_epsilon_is_a_float64_argument_of_its_kernel(tmp_path):
    g = _gpu_graph(_rms_norm, ((8, 256), torch.float32, "cuda"), ((), torch.float64, "cpu"),
                   ((256,), torch.float32, "cuda"))
    assert not g.fallback_ops
    assert "eps_value = HostDouble(eps.item())" in g.wrapper_source.replace("arg1_1", "eps"), g.wrapper_source
    (kernel,) = [k for k in g.kernels if not k.interpret]
    assert ": tl.float64" in kernel.source, kernel.source  # Triton's JIT would take a float as float32
    assert ("fp64",) in kernel.launch_guess
    # The kernel compiles for an H100 with the argument as a double.
    path = tmp_path / f"{kernel.name}.py"
    path.write_text(kernel.source)
    fn = getattr(load_module(str(path), interpret=False), kernel.name)
    spec = tuple(kernel.launch_guess) + appended_description(kernel.workspace, kernel.ticket)
    binary = KernelVariants(fn, kernel.source, None).load_or_compile(
        spec, block_constants(kernel.config, False, None), kernel.config.num_warps, (9, 0))
    assert "fp64" in binary.arg_kinds


def test_a_gpu_value_copied_into_a_cpu_scalar_is_copied_by_aten():
    # The copy's result is on the CPU: a CPU kernel reading the GPU sum would read GPU memory.
    def fn(x, s):
        s.copy_(x.sum())
        return x * 2
    g = _gpu_graph(fn, ((4, 8), torch.float32, "cuda"), ((), torch.float32, "cpu"))
    assert "aten.copy.default(" in g.wrapper_source, g.wrapper_source
    cpu_kernels = [k for k in g.kernels if k.interpret or k.backend == "halide"]
    assert all("buf0" not in k.source for k in cpu_kernels)


def test_an_aten_call_writing_into_an_input_is_kept():
    # copy_ into a CPU input from a GPU value runs in ATen; nothing reads its result, and it must
    # still run for its write.
    aten = torch.ops.aten
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x, s):
        aten.copy_.default(s, aten.amax.default(x))
        return (x + 1,)
    with FakeTensorMode():
        gm = make_fx(fn)(torch.empty(4, 8, device="cuda"), torch.empty(3))
    with smelt.config.override(cuda_backend="triton"):
        g = generate_graph(gm, "inference", smelt.config.current())
    assert "aten.copy_.default(" in g.wrapper_source, g.wrapper_source


def test_only_the_arguments_an_aten_call_writes_count_as_mutated_inputs():
    # copy_(s, src) writes s alone: an input passed as src is read, not written (CUDA graphs copy a
    # mutated input back after each replay).
    aten = torch.ops.aten
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x, s, src):
        aten.copy_.default(s, src)
        return (x + 1,)
    with FakeTensorMode():
        gm = make_fx(fn)(torch.empty(4, 8, device="cuda"), torch.empty(3), torch.empty(3, device="cuda"))
    with smelt.config.override(cuda_backend="triton"):
        g = generate_graph(gm, "inference", smelt.config.current())
    assert "MUTATED_INPUTS = (1,)" in g.wrapper_source, g.wrapper_source


def test_a_host_double_is_described_as_float64_and_a_plain_float_as_float32():
    from smelt.runtime.cuda_binary import describe
    from smelt.runtime.host_scalar import HostDouble
    assert describe([HostDouble(0.1), 0.1, 3]) == (("fp64",), ("fp32",), ("i32", False))


def test_updates_reading_one_rate_are_one_launch_that_takes_it_as_a_double(tmp_path):
    # A learning rate given as a CPU tensor: the per-tensor updates share one combo launch, whose
    # kernel takes the rate after its two tables and compiles for an H100 with it as a double.
    from smelt.runtime.combo_launcher import launch_description

    aten = torch.ops.aten
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(p0, g0, p1, g1, p2, g2, lr):  # as AOTAutograd gives p.sub_(g * lr): the update, copied back
        for p, g in ((p0, g0), (p1, g1), (p2, g2)):
            aten.copy_.default(p, aten.sub.Tensor(p, aten.mul.Tensor(g, lr)))
        return ()
    shapes = [(300,), (64, 5), (1000,)]
    with FakeTensorMode():
        args = [torch.empty(s, device="cuda") for s in shapes for _ in range(2)] + [torch.empty(())]
        gm = make_fx(fn)(*args)
    with smelt.config.override(cuda_backend="triton"):
        g = generate_graph(gm, "inference", smelt.config.current())
    assert not g.fallback_ops
    (kernel,) = [k for k in g.kernels if not k.interpret]
    assert kernel.combo is not None and kernel.combo[-1] == 1, kernel.combo
    assert ": tl.float64" in kernel.source, kernel.source
    call = [line for line in g.wrapper_source.splitlines() if line.strip().startswith(kernel.name)]
    assert call and call[0].rstrip(")").endswith("_value"), g.wrapper_source  # the rate, after the buffers
    path = tmp_path / f"{kernel.name}.py"
    path.write_text(kernel.source)
    fn = getattr(load_module(str(path), interpret=False), kernel.name)
    binary = KernelVariants(fn, kernel.source, None).load_or_compile(
        launch_description(1), block_constants(kernel.config, True, None), kernel.config.num_warps, (9, 0))
    assert "fp64" in binary.arg_kinds
