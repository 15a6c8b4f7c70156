"""The reference backend (SMELT_CPU_BACKEND=reference): real programs against eager, and the
kernels really ran as torch operations rather than falling back to Triton."""
import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

import smelt  # noqa: F401  (registers the backend)
import smelt.observe
from smelt.codegen import backends

pytestmark = [pytest.mark.smelt_only, pytest.mark.cpu_backend_independent]


@pytest.fixture(autouse=True)
def reference_backend(monkeypatch, device):
    if device != "cpu":
        pytest.skip("SMELT_CPU_BACKEND chooses CPU kernels")
    monkeypatch.setenv("SMELT_CPU_BACKEND", "reference")
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "0")
    torch._dynamo.reset()
    smelt.observe.reset()
    yield
    torch._dynamo.reset()


def kernel_names() -> list[str]:
    return [name for graph in smelt.observe.compiled_graphs() for name in graph.kernel_names]


def ran_in_reference(at_least: float = 1.0) -> None:
    names = kernel_names()
    assert names, "no kernel was compiled"
    share = sum(n.startswith("reference_") for n in names) / len(names)
    assert share >= at_least, names


def compiled(fn):
    return torch.compile(fn, backend="smelt", fullgraph=True)


def test_registered_as_a_backend():
    backend = backends.named("reference")
    assert backend.name == "reference" and "cpu" in backend.devices


def test_pointwise_broadcasting_and_type_promotion():
    def f(a, b, c):
        return (a * b + c).sigmoid() - (c > 0).to(torch.int32) + a.to(torch.float16)

    a = torch.randn(4, 1, 8)
    b = torch.randint(-3, 3, (5, 1))
    c = torch.randn(8, dtype=torch.float64)
    torch.testing.assert_close(compiled(f)(a, b, c), f(a, b, c))
    ran_in_reference()


def test_transposed_and_sliced_inputs():
    def f(x, y):
        return x.t() * 2 + y[1::2, ::3]

    x = torch.randn(11, 10)
    y = torch.randn(20, 36)[:, 3:]  # a view with a storage offset
    torch.testing.assert_close(compiled(f)(x, y), f(x, y))
    ran_in_reference()


def test_half_floats_round_as_eager():
    def f(x, y):
        return (x * y + 1).exp() / (x - y)

    x, y = torch.randn(64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    torch.testing.assert_close(compiled(f)(x, y), f(x, y), atol=0, rtol=0)
    ran_in_reference()


@pytest.mark.parametrize("shape", [(8, 33), (3, 5000)])
def test_softmax(shape):
    x = torch.randn(*shape)
    torch.testing.assert_close(compiled(lambda x: torch.softmax(x, -1))(x), torch.softmax(x, -1))
    ran_in_reference()


def test_layer_norm():
    x, w, b = torch.randn(6, 40), torch.randn(40), torch.randn(40)
    f = lambda x, w, b: F.layer_norm(x, (40,), w, b)  # noqa: E731
    torch.testing.assert_close(compiled(f)(x, w, b), f(x, w, b))
    ran_in_reference()


def test_reductions():
    def f(x):
        return x.sum(0), x.amax(1), x.amin(), x.prod(1), x.argmax(1), x.argmin(0), torch.var_mean(x, 1), x.any(1)

    x = torch.randn(7, 13)
    x[2, 3] = float("nan")
    torch.testing.assert_close(compiled(f)(x), f(x), equal_nan=True)
    ran_in_reference()


def test_gather_and_embedding():
    def f(x, i, table, tokens):
        return torch.gather(x, 1, i) + 1, F.embedding(tokens, table) * 2

    x, i = torch.randn(5, 9), torch.randint(-9, 9, (5, 4)) % 9
    table, tokens = torch.randn(11, 6), torch.randint(0, 11, (3, 4))
    torch.testing.assert_close(compiled(f)(x, i, table, tokens), f(x, i, table, tokens))
    ran_in_reference()


def test_out_of_bounds_index_raises():
    def f(table, tokens):
        return table[tokens] + 1

    with pytest.raises(Exception, match="out of bounds"):
        compiled(f)(torch.randn(4, 3), torch.tensor([1, 7]))


def test_scan_and_scatter():
    def f(x, i, v):
        return x.cumsum(1), x.cummax(1), torch.zeros(10).index_add(0, i, v), torch.zeros(10).scatter(0, i[:3], v[:3])

    x, i, v = torch.randn(4, 37), torch.tensor([1, 3, 5, 1, 9]), torch.randn(5)
    torch.testing.assert_close(compiled(f)(x, i, v), f(x, i, v))
    ran_in_reference()


def test_random_ops_fall_back_to_triton():
    def f(x):
        return F.dropout(x, 0.5, training=True) * 0 + x.exp()

    x = torch.randn(64)
    torch.testing.assert_close(compiled(f)(x), x.exp())
    assert any(n.startswith("triton_") for n in kernel_names())


def test_mlp_forward_and_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    x, target = torch.randn(8, 16), torch.randint(0, 4, (8,))

    def loss(model, x):
        return F.cross_entropy(model(x), target)

    expected = loss(model, x)
    expected.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    actual = compiled(loss)(model, x)
    actual.backward()
    torch.testing.assert_close(actual, expected)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-4)
    ran_in_reference()
    assert {g.kind for g in smelt.observe.compiled_graphs()} >= {"forward", "backward"}


def test_graph_is_not_written_to_the_cache(monkeypatch, tmp_path):
    from smelt import graph_cache
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "1")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    graph_cache.stats.clear()
    x = torch.randn(9)
    torch.testing.assert_close(compiled(lambda x: x.cos() + 1)(x), x.cos() + 1)
    assert not list(tmp_path.rglob("*.json")) and not list((tmp_path).glob("aten*"))
    ran_in_reference()


def test_a_member_read_back_through_the_storage_it_fills():
    """A cat's last piece is computed in the same kernel as a sum over the whole cat, which reads
    the piece back through the cat's storage: stored at the end of the kernel, the sum read
    uninitialized memory (the members are stored in order now, as a printed kernel's program does)."""
    pieces = [torch.randn(4, 4, (k % 3) + 1) for k in range(11)]

    def f(*pieces):
        out = torch.cat([p.exp() if k % 2 else p.sum(2, keepdim=True).expand_as(p) for k, p in enumerate(pieces)], 2)
        return out, out.sum(2)
    for actual, expected in zip(compiled(f)(*pieces), f(*pieces)):
        torch.testing.assert_close(actual, expected)
    ran_in_reference()


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_unsigned_outputs(dtype):
    """torch has no index_put for uint16/32/64: their stores go through the signed twin's bits."""
    def f(x):
        return x.to(torch.int64).to(dtype)
    x = torch.tensor([2.04, 1.54, -2.77, -0.5, -3e9, 5e9])
    torch.testing.assert_close(compiled(f)(x), f(x))
    ran_in_reference()
