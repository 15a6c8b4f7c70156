"""A float32 addmm of many rows runs as mm with its bias added by the kernel after it
(Target.float32_product_bias_in_kernel: ATen's float32 addmm takes cuBLASLt's bias epilogue, a slower
kernel on the H200). Halide's CPU target keeps addmm."""
import pytest
import torch
import torch.nn.functional as F

from smelt import config


def _bias_in_kernel(device: str) -> bool:
    return torch.device(device).type == "cuda" or config.current().backend_for("cpu") == "triton"


def _linear_tanh(x, w, b):
    return torch.tanh(F.linear(x, w, b)) + 1  # (a GELU would be the addmm's own epilogue on the CPU)


@pytest.mark.parametrize("rows", [300, 8])
def test_a_float32_linear_adds_its_bias_in_the_next_kernel(device, compile_fn, observe, rows):
    x = torch.randn(rows, 32, device=device)
    w, b = torch.randn(24, 32, device=device), torch.randn(24, device=device)
    torch.testing.assert_close(compile_fn(_linear_tanh)(x, w, b), _linear_tanh(x, w, b))
    (graph,) = observe.compiled_graphs()
    split = _bias_in_kernel(device) and rows >= 256  # a short product keeps cuBLASLt's epilogue
    assert ("torch.addmm(" not in graph.wrapper_source) == split, graph.wrapper_source
    if split:
        assert len(graph.kernel_names) == 1  # the bias, tanh and + 1 in one kernel


def test_rows_of_a_symbolic_count_add_their_bias_in_a_kernel(device, backend, observe):
    fn = torch.compile(lambda x, w, b: F.linear(x, w, b).relu(), backend=backend, dynamic=True)
    w, b = torch.randn(24, 32, device=device), torch.randn(24, device=device)
    for rows in (5, 300, 17):
        x = torch.randn(rows, 32, device=device)
        torch.testing.assert_close(fn(x, w, b), F.linear(x, w, b).relu())
    if _bias_in_kernel(device):
        assert all("torch.addmm(" not in g.wrapper_source for g in observe.compiled_graphs())


def test_a_linear_in_training_gets_eagers_gradients(device, compile_fn):
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.Tanh(), torch.nn.Linear(48, 8)).to(device)
    x = torch.randn(260, 32, device=device)
    compile_fn(model)(x).square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    torch.testing.assert_close(grads, [p.grad for p in model.parameters()], rtol=1e-4, atol=1e-4)


def test_a_product_an_aten_call_reads_keeps_its_bias_in_cublas(device, compile_fn, observe):
    # GPT-2's fused q/k/v projection, split for attention: an add of its own would cost a pass.
    w, b = torch.randn(3 * 16, 16, device=device), torch.randn(3 * 16, device=device)

    def fn(x):
        q, k, v = F.linear(x, w, b).view(2, 150, 3 * 16).split(16, dim=-1)
        return F.scaled_dot_product_attention(q, k, v)
    x = torch.randn(300, 16, device=device)
    torch.testing.assert_close(compile_fn(fn)(x), fn(x))
    (graph,) = observe.compiled_graphs()
    assert "torch.addmm(" in graph.wrapper_source, graph.wrapper_source


@pytest.mark.parametrize("setting", ["on", "off"])
def test_the_setting_decides_over_the_target(device, compile_fn, observe, setting):
    x = torch.randn(300, 32, device=device)
    w, b = torch.randn(24, 32, device=device), torch.randn(24, device=device)
    with config.override(float32_product_bias=setting):
        torch.testing.assert_close(compile_fn(_linear_tanh)(x, w, b), _linear_tanh(x, w, b))
    (graph,) = observe.compiled_graphs()
    assert ("torch.addmm(" in graph.wrapper_source) == (setting == "off"), graph.wrapper_source
