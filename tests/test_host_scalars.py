"""Zero-dimensional float CPU inputs (Dynamo passes a Python float it does not specialize as one):
a GPU graph's Triton kernels take each as a float64 argument read on the host (Target.host_scalar_args),
so the ops reading it stay in the kernel instead of running in ATen for mixing devices. On the CPU
these tests check eager's values (the scalar is read from memory there); on the GPU, the arguments."""
import pytest
import torch

from smelt import config


def _reads_by_value(device: str) -> bool:
    """Whether this run's kernels on `device` take host scalars as arguments: a GPU's Triton kernels
    (Halide's read memory; on the CPU the scalar is the kernels' own device's memory)."""
    device_type = torch.device(device).type
    return device_type != "cpu" and config.current().backend_for(device_type) == "triton"


def _rms_norm(x, eps, scale):
    v = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(v + eps) * scale


def test_a_norms_epsilon_is_a_kernel_argument(compile_fn, device, observe):
    x = torch.randn(8, 64, device=device)
    fn = compile_fn(_rms_norm)
    for eps, scale in ((1e-6, 0.3), (0.5, 2.0), (3.0, -1.0)):  # new values, no new compile
        args = (x, torch.tensor(eps, dtype=torch.float64), torch.tensor(scale))
        torch.testing.assert_close(fn(*args), _rms_norm(*args))
    graphs = observe.compiled_graphs()
    assert len(graphs) == 1
    if _reads_by_value(device):
        assert not graphs[0].fallback_ops
        wrapper = graphs[0].wrapper_source
        assert "HostDouble(" in wrapper, wrapper


def test_a_float64_scalar_keeps_every_digit(compile_fn, device):
    # The argument is a double: a float32 one would round 0.1 before float64 math used it.
    fn = compile_fn(lambda x, s: x * s + s * 3)
    x = torch.randn(5, 7, dtype=torch.float64, device=device)
    s = torch.tensor(0.1, dtype=torch.float64)
    torch.testing.assert_close(fn(x, s), x * s + s * 3, atol=0, rtol=0)


def test_a_float32_scalar_and_an_output_on_the_cpu(compile_fn, device):
    # The scalar is read by a device kernel and by CPU arithmetic whose result is a CPU output.
    def fn(x, s):
        return x + s, s * 2 + 1
    x = torch.randn(3, 4, device=device)
    s = torch.tensor(0.75)
    got, expected = compile_fn(fn)(x, s), fn(x, s)
    assert got[1].device == expected[1].device
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_an_unspecialized_python_float(device, backend, observe):
    # dynamic=True: Dynamo passes `eps` as a float64 CPU tensor, and a new value reuses the graph.
    def fn(x, eps: float):
        return x / (x.abs().sum(-1, keepdim=True) + eps) * eps
    x = torch.randn(4, 32, device=device)
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for eps in (1e-6, 0.25, 3.0):
        torch.testing.assert_close(compiled(x, eps), fn(x, eps))
    if _reads_by_value(device):
        assert not any(g.fallback_ops for g in observe.compiled_graphs())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_scalar_beside_half_floats(compile_fn, device, dtype):
    # Eager converts the CPU scalar to the op's compute type (float32) before adding.
    fn = compile_fn(lambda x, s: (x + s) * s)
    x = torch.randn(6, 10, device=device).to(dtype)
    s = torch.tensor(1e-3, dtype=torch.float64)
    torch.testing.assert_close(fn(x, s), (x + s) * s, atol=0, rtol=0)


def test_the_gradient_through_a_host_scalar(compile_fn, device):
    def fn(x, eps, w):
        return (_rms_norm(x, eps, w) ** 2).sum()
    x = torch.randn(4, 16, device=device, requires_grad=True)
    w = torch.randn(16, device=device, requires_grad=True)
    eps = torch.tensor(1e-5, dtype=torch.float64)
    compile_fn(fn)(x, eps, w).backward()
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    fn(x, eps, w).backward()
    torch.testing.assert_close((gx, gw), (x.grad, w.grad))


def test_kernels_take_no_pointer_to_it(device, compile_fn, observe):
    if not _reads_by_value(device):
        pytest.skip("read from memory here: a CPU graph's scalar, or Halide's kernels")
    compiled = compile_fn(lambda x, s: torch.sigmoid(x) * s)
    compiled(torch.randn(64, device=device), torch.tensor(2.5, dtype=torch.float64))
    (graph,) = observe.compiled_graphs()
    (source,) = graph.kernel_sources.values()
    assert "_value" in source and "tl.full([], " in source, source
    assert source.count("tl.load(") == 1, source


def test_a_scalar_the_graph_writes_into(compile_fn, device):
    # The kernels read its value from before the write, as the functionalized graph says; the
    # input's memory gets the new value.
    def fn(x, s):
        y = x * s
        s.add_(1.5)
        return y + s
    x = torch.randn(3, 5, device=device)
    s, s_eager = torch.tensor(2.0), torch.tensor(2.0)
    torch.testing.assert_close(compile_fn(fn)(x, s), fn(x, s_eager), atol=0, rtol=0)
    assert s.item() == s_eager.item() == 3.5


def test_per_tensor_updates_reading_one_rate_share_a_launch(compile_fn, device, observe):
    """A learning rate passed as a CPU tensor (so that a scheduler's new rates do not recompile): the
    per-parameter updates reading it are combined into one launch, which takes the rate once. On
    the CPU, SMELT_HOST_SCALAR_ARGS=on makes such a scalar an argument in CPU graphs too, so that the
    interpreter runs the combined kernel with the rate passed by value."""
    if config.current().backend_for(torch.device(device).type) != "triton":
        pytest.skip("host scalars are arguments of Triton kernels only")
    with config.override(host_scalar_args="on"):
        _per_tensor_updates_share_a_launch(compile_fn, device, observe)


def _per_tensor_updates_share_a_launch(compile_fn, device, observe):
    torch.manual_seed(0)
    shapes = [(7,), (33,), (5, 4), (130,), (2, 3, 5), (64,)] * 2

    def step(params, grads, lr):
        for p, g in zip(params, grads):
            p.sub_(g * lr)

    params = [torch.randn(s, device=device) for s in shapes]
    grads = [torch.randn(s, device=device) for s in shapes]
    ours = [p.clone() for p in params]
    compiled = compile_fn(step)
    for rate in (0.1, 0.025):  # a new rate: the same graph
        lr = torch.tensor(rate)
        step(params, grads, lr)
        compiled(ours, grads, lr)
        torch.testing.assert_close(ours, params, atol=1e-6, rtol=1e-6)
    (graph,) = observe.compiled_graphs()
    wrapper = graph.wrapper_source
    assert "HostDouble(" in wrapper, wrapper
    launches = [line for line in wrapper.splitlines() if line.strip().startswith("triton_")]
    assert len(launches) == 1 and "triton_combo_" in launches[0], wrapper
    assert launches[0].rstrip(")").endswith("_value"), launches[0]  # the rate, after the buffers


def test_a_literal_moved_to_the_gpu_is_computed_there(compile_fn, device, observe):
    """DeBERTa's relative positions: `torch.tensor(mid - 1).type_as(positions)` and a CPU arange
    sent to the GPU each made a CPU kernel (Triton's interpreter where Halide is missing: DeBERTa's
    training row did not finish) and a copy to the GPU at every call."""
    def fn(rel, x):
        near = (rel < 4) & (rel > -4)
        far = torch.where(near, torch.tensor(3).type_as(rel), rel.abs())
        scale = torch.sqrt(torch.tensor(rel.shape[-1], dtype=torch.float) * 3).to(x.device)
        return far + torch.arange(rel.shape[-1]).to(rel.device), x / scale
    rel, x = torch.arange(-8, 8, device=device).reshape(2, 8), torch.randn(2, 8, device=device)
    torch.testing.assert_close(compile_fn(fn)(rel, x), fn(rel, x))
    if device != "cpu":
        (graph,) = observe.compiled_graphs()
        assert "cpu" not in graph.namespace["GRAPH_DEVICE_TYPES"], graph.wrapper_source
        # the kernels' headers name `_to_copy` among their source ops; the call body must not run one
        call_body = graph.wrapper_source.split("def call(")[1]
        assert "_to_copy" not in call_body and "cpu" not in call_body, graph.wrapper_source
