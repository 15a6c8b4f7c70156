"""Inference attention written by hand over few keys runs as smelt::short_attention, one Triton
kernel (runtime/short_attention.py; on the CPU through Triton's interpreter): its values are eager's
but for the products' order of summation, in each form a model writes it (Swin's windows with their
relative-position bias and shifted-window mask), and a chain it does not take stays as written."""
import pytest
import torch
import torch.nn.functional as F

import smelt.backend
import smelt.config
from smelt.runtime.short_attention import short_attention

TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


@pytest.fixture
def asked(monkeypatch):
    """For each chain the pass asks the setting about: whether it needs gradients."""
    flags = []
    real = smelt.backend.handwritten_attention_to_sdpa

    def recording(gm, short_kernel):
        def ask(device_type, training):
            flags.append(training)
            return short_kernel(device_type, training)
        return real(gm, ask)
    monkeypatch.setattr(smelt.backend, "handwritten_attention_to_sdpa", recording)
    return flags


@pytest.fixture
def kernel_runs(monkeypatch):
    """How many times the kernel ran."""
    from smelt.runtime import short_attention as op_module
    runs = []
    real = op_module._kernels

    def counting(device):
        runs.append(device)
        return real(device)
    monkeypatch.setattr(op_module, "_kernels", counting)
    return runs


@pytest.fixture
def short_kernel():
    with smelt.config.override(short_attention="on"):
        yield


def _chain(q, k, v, terms, q_scale=1.0, score_scale=1.0, divides=False):
    """The ops the kernel stands for, as eager runs them."""
    s = (q * q_scale if q_scale != 1.0 else q) @ k.transpose(-2, -1)
    if score_scale != 1.0:
        s = s / score_scale if divides else s * score_scale
    for term in terms:
        s = (s.view(term.shape) + term).view(s.shape)
    return s.softmax(-1) @ v


def _close(actual, expected, dtype):
    tolerance = TOLERANCES[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tolerance, rtol=tolerance)


CASES = {
    # lead, queries, keys, head size, value head size
    "swin_window": ((4, 3), 49, 49, 32, 32),
    "cross_attention": ((2, 2), 5, 13, 16, 8),
    "folded_heads": ((6,), 8, 8, 16, 16),
    "one_key": ((2, 1), 3, 1, 16, 16),
    "widest": ((1, 1), 128, 128, 128, 128),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_kernel_computes_eagers_chain(device, dtype, case):
    lead, n_q, n_k, d, dv = CASES[case]
    torch.manual_seed(0)
    q = torch.randn(*lead, n_q, d, device=device, dtype=dtype)
    k = torch.randn(*lead, n_k, d, device=device, dtype=dtype)
    v = torch.randn(*lead, n_k, dv, device=device, dtype=dtype)
    bias = torch.randn(*lead[1:], n_q, n_k, device=device, dtype=dtype).expand(*lead, n_q, n_k)
    out = short_attention(q, k, v, [bias], d ** -0.5, 1.0, False, False, False)
    _close(out, _chain(q, k, v, [bias], q_scale=d ** -0.5), dtype)
    divided = short_attention(q, k, v, [], 1.0, 3.0, True, False, False)
    _close(divided, _chain(q, k, v, [], score_scale=3.0, divides=True), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", ["swin_window", "cross_attention", "folded_heads", "one_key"], ids=str)
@pytest.mark.parametrize("scaled", ["q", "divided"], ids=str)
def test_the_backward_gives_eagers_gradients(device, dtype, case, scaled):
    """Through the op's autograd: q, k, v and a broadcast term's gradients against eager's chain's."""
    lead, n_q, n_k, d, dv = CASES[case]
    torch.manual_seed(0)
    q, k = (torch.randn(*lead, n, d, device=device, dtype=dtype, requires_grad=True) for n in (n_q, n_k))
    v = torch.randn(*lead, n_k, dv, device=device, dtype=dtype, requires_grad=True)
    bias = torch.randn(*lead[1:], n_q, n_k, device=device, dtype=dtype, requires_grad=True)
    q_scale, score_scale, divides = (d ** -0.5, 1.0, False) if scaled == "q" else (1.0, 3.0, True)
    expected = _chain(q, k, v, [bias.expand(*lead, n_q, n_k)], q_scale, score_scale, divides)
    grad = torch.randn_like(expected)
    want = torch.autograd.grad(expected, [q, k, v, bias], grad)
    out = short_attention(q, k, v, [bias.expand(*lead, n_q, n_k)], q_scale, score_scale, divides, False, False)
    got = torch.autograd.grad(out, [q, k, v, bias], grad)
    tolerance = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}[dtype]
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), atol=tolerance * (1 + w.abs().max().item()), rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_swins_two_terms_read_in_place_from_strided_operands(device, dtype):
    """q, k and v views of one qkv product, a bias broadcast over windows and a mask per window
    added at [batch, windows, heads, Q, K]; the output stored heads-last."""
    batch, windows, heads, n, d = 2, 4, 3, 49, 32
    torch.manual_seed(0)
    qkv = torch.randn(batch * windows, n, 3, heads, d, device=device, dtype=dtype).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    bias = torch.randn(1, heads, n, n, device=device, dtype=dtype).expand(batch * windows, heads, n, n)
    mask = torch.where(torch.rand(windows, n, n, device=device) < 0.3, -100.0, 0.0).to(dtype)
    per_window = mask.unsqueeze(1).unsqueeze(0).expand(batch, windows, heads, n, n)
    expected = _chain(q, k, v, [bias, per_window], q_scale=0.25)
    for heads_last in (False, True):
        out = short_attention(q, k, v, [bias, per_window], 0.25, 1.0, False, heads_last, False)
        _close(out, expected, dtype)
        assert out.transpose(1, 2).is_contiguous() == heads_last


def test_a_row_of_no_keys_is_nan_as_in_eager(device):
    q, k, v = (torch.randn(1, 2, 4, 16, device=device) for _ in range(3))
    mask = torch.zeros(1, 2, 4, 4, device=device)
    mask[0, 1, 2] = float("-inf")
    out = short_attention(q, k, v, [mask], 1.0, 1.0, False, False, False)
    expected = _chain(q, k, v, [mask])
    assert out[0, 1, 2].isnan().all() and expected[0, 1, 2].isnan().all()
    _close(torch.nan_to_num(out), torch.nan_to_num(expected), torch.float32)


class WindowAttention(torch.nn.Module):
    """timm's Swin window attention as it is written when SDPA is off."""

    def __init__(self, dim, heads, window, windows):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.bias_table = torch.nn.Parameter(torch.randn((2 * window - 1) ** 2, heads))
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + window - 1
        self.register_buffer("index", relative[..., 0] * (2 * window - 1) + relative[..., 1])
        shifted = torch.where(torch.rand(windows, window ** 2, window ** 2) < 0.2, -100.0, 0.0)
        self.register_buffer("mask", shifted)

    def forward(self, x, shifted: bool):
        b_, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b_, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        bias = self.bias_table[self.index.view(-1)].view(n, n, -1).permute(2, 0, 1).contiguous()
        attn = attn + bias.unsqueeze(0)
        if shifted:
            windows = self.mask.shape[0]
            attn = attn.view(-1, windows, self.heads, n, n) + self.mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, n, n)
        attn = F.dropout(attn.softmax(-1), 0.0, False)
        return self.proj((attn @ v).transpose(1, 2).reshape(b_, n, -1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shifted", [False, True], ids=["windows", "shifted_windows"])
def test_swins_window_attention_runs_as_one_call(device, dtype, shifted, rewrites, kernel_runs, short_kernel):
    torch.manual_seed(0)
    model = WindowAttention(dim=64, heads=2, window=7, windows=4).to(device=device, dtype=dtype).eval()
    x = torch.randn(8, 49, 64, device=device, dtype=dtype)
    with torch.no_grad():
        expected = model(x, shifted)
        out = torch.compile(model, backend="smelt")(x, shifted)
    _close(out, expected, dtype)
    assert rewrites == [1] and len(kernel_runs) == 1


def _training_gradients(model, x, compiled: bool):
    model.zero_grad()
    x.grad = None
    run = torch.compile(model, backend="smelt") if compiled else model
    (run(x, True).float() ** 2).sum().backward()
    return [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]


def test_training_chains_follow_the_target(device, kernel_runs):
    """auto: a training graph's chains run through the kernel where the device's Target says so
    (the GPU's, also the Triton backend's on the CPU; not Halide's)."""
    from smelt.pipeline import targets_for
    wanted = targets_for(smelt.config.current())(torch.device(device).type).short_attention_training
    torch.manual_seed(0)
    model = WindowAttention(dim=32, heads=2, window=4, windows=2).to(device)
    x = torch.randn(4, 16, 32, device=device, requires_grad=True)
    expected = _training_gradients(model, x, compiled=False)
    for got, want in zip(_training_gradients(model, x, compiled=True), expected):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert len(kernel_runs) == (2 if wanted else 0)  # the forward and its backward


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_training_gradients_through_the_kernel_are_eagers(device, dtype, kernel_runs, short_kernel):
    """The backward computes the probabilities again: the gradients of the input, the projections
    and the relative-position table (through the bias term's broadcast) are eager's."""
    torch.manual_seed(0)
    model = WindowAttention(dim=32, heads=2, window=4, windows=2).to(device=device, dtype=dtype)
    x = torch.randn(4, 16, 32, device=device, dtype=dtype, requires_grad=True)
    expected = _training_gradients(model, x, compiled=False)
    got = _training_gradients(model, x, compiled=True)
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    for g, want in zip(got, expected):
        torch.testing.assert_close(g.float(), want.float(), atol=tolerance * (1 + want.abs().max().item()), rtol=tolerance)
    assert len(kernel_runs) == 2  # the forward and its backward


def test_a_masked_fill_is_not_taken(device, kernel_runs, short_kernel):
    def filled(q, k, v, keep):
        w = (q @ k.transpose(-2, -1)).masked_fill(~keep, torch.finfo(q.dtype).min)
        return w.softmax(-1) @ v
    q, k, v = (torch.randn(2, 2, 8, 16, device=device) for _ in range(3))
    keep = torch.rand(2, 1, 1, 8, device=device) < 0.7
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(filled, backend="smelt")(q, k, v, keep), filled(q, k, v, keep))
    assert kernel_runs == []  # SDPA's call on the CPU, as written on CUDA (8 keys)


def test_off_by_setting(device, kernel_runs):
    torch.manual_seed(0)
    model = WindowAttention(dim=32, heads=2, window=4, windows=2).to(device).eval()
    x = torch.randn(4, 16, 32, device=device)
    with torch.no_grad(), smelt.config.override(short_attention="off"):
        torch.testing.assert_close(torch.compile(model, backend="smelt")(x, True), model(x, True), atol=1e-5, rtol=1e-5)
    assert kernel_runs == []


def test_leaves_that_require_grad_under_no_grad_ask_for_no_gradients(device, asked, kernel_runs, short_kernel):
    """Compiled with gradients off, a leaf's requires_grad asks for nothing."""
    def windows(q, k, v, bias):
        return ((q @ k.transpose(-2, -1)) * 0.25 + bias).softmax(-1) @ v
    q, k, v = (torch.randn(2, 2, 16, 16, device=device, requires_grad=True) for _ in range(3))
    bias = torch.randn(2, 16, 16, device=device)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(windows, backend="smelt")(q, k, v, bias), windows(q, k, v, bias),
                                   atol=1e-5, rtol=1e-5)
    assert asked == [False] and len(kernel_runs) == 1


def test_gradients_turned_on_inside_the_graph_ask_for_them(device, asked, short_kernel):
    def windows(q, k, v):
        with torch.enable_grad():
            return ((q @ k.transpose(-2, -1)) * 0.25).softmax(-1) @ v
    q, k, v = (torch.randn(2, 2, 16, 16, device=device, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        out = torch.compile(windows, backend="smelt")(q, k, v)
    torch.testing.assert_close(out, windows(q, k, v), atol=1e-5, rtol=1e-5)
    assert asked == [True]


def test_a_call_sites_launch_is_worked_out_once_and_its_aligned_binary_kept(monkeypatch):
    """The CUDA launch path's bookkeeping, with the binaries stood in for: the launch values
    are computed once per geometry, the all-aligned binary is looked up once, and a call with a
    misaligned pointer is described on its own (a binary compiled for aligned pointers would
    read it with 16-byte vector loads)."""
    from smelt.runtime import short_attention_kernel as kernel
    looked_up, launched = [], []

    class Binary:
        def launch(self, grid, args, device):
            launched.append((grid, args[6:]))

    class Variants:
        def binary(self, args, constexprs, num_warps, device):
            looked_up.append(tuple(a.data_ptr() % 16 == 0 for a in args[:6]))
            return Binary()
    variants = Variants()
    monkeypatch.setattr(kernel, "_launches", {})
    storage = torch.randn(4 * 2 * 8 * 16 + 1)
    q = storage[:4 * 2 * 8 * 16].view(4, 2, 8, 16)
    out = torch.empty_like(q)
    args, constexprs = kernel.launch_arguments(q, q, q, [], 1.0, 1.0, False, out)
    site = kernel._Launch(8, args[6:], constexprs)  # 8 programs
    for _ in range(3):
        assert kernel._launch_binary(site, args, 0, lambda: variants)
    assert looked_up == [(True,) * 6] and len(launched) == 3 and site.binaries
    shifted = storage[1:].view(4, 2, 8, 16)  # 4 bytes off: not 16-byte aligned
    misaligned = (shifted,) + args[1:]
    for _ in range(2):
        assert kernel._launch_binary(site, misaligned, 0, lambda: variants)
    assert looked_up[1:] == [(False,) + (True,) * 5] * 2


def test_a_call_site_the_binary_path_refuses_says_so_once(monkeypatch, caplog):
    """A binary smelt's launcher cannot launch leaves the call site to Triton's JIT (tens of us of
    host a call): a debug line says so, once, and the JIT's launch is kept without asking again."""
    import logging

    from smelt.runtime import short_attention_kernel as kernel
    from smelt.runtime.kernel_binaries import Unsupported
    asked = []

    class Refusing:
        def binary(self, args, constexprs, num_warps, device):
            asked.append(1)
            raise Unsupported("kernel needs global scratch memory")
    refusing = Refusing()
    q = torch.randn(4, 2, 8, 16)
    args, constexprs = kernel.launch_arguments(q, q, q, [], 1.0, 1.0, False, torch.empty_like(q))
    site = kernel._Launch(8, args[6:], constexprs)
    with caplog.at_level(logging.DEBUG, logger="smelt.runtime"):
        for _ in range(3):
            assert not kernel._launch_binary(site, args, 0, lambda: refusing)
    assert len(asked) == 1
    assert [r.getMessage() for r in caplog.records if "Triton's JIT" in r.getMessage()] == [
        "smelt: short attention's forward launched through Triton's JIT: kernel needs global scratch memory"]


@pytest.mark.parametrize("matrices", [2, 3, 4])
def test_several_matrices_a_program_give_the_same_bits(device, monkeypatch, matrices):
    """15 matrices, so the last program has fewer than its share."""
    from smelt.runtime import short_attention as short_attention_module
    torch.manual_seed(0)
    q, k, v = (torch.randn(5, 3, 49, 32, device=device, dtype=torch.bfloat16) for _ in range(3))
    bias = torch.randn(1, 3, 49, 49, device=device, dtype=torch.bfloat16).expand(5, 3, 49, 49)
    one = short_attention(q, k, v, [bias], 0.25, 1.0, False, False, False)
    runs = short_attention_module._kernels(q.device)  # on the CPU a copy of the module, interpreted
    monkeypatch.setattr(runs, "MATRICES", matrices)
    several = short_attention(q, k, v, [bias], 0.25, 1.0, False, False, False)
    assert any(launch.programs == -(-15 // matrices) for launch in runs._launches.values())  # it took effect
    assert torch.equal(several, one)


def test_a_transposed_result_the_caller_receives_keeps_eagers_strides(device, kernel_runs, short_kernel):
    """Heads-last storage only where the transpose is reshaped into concatenated heads."""
    def transposed(q, k, v):
        return ((q @ k.transpose(-2, -1)) * 0.25).softmax(-1).matmul(v).transpose(1, 2)

    def concatenated(q, k, v):
        return transposed(q, k, v).reshape(2, 16, -1)
    q, k, v = (torch.randn(2, 3, 16, 8, device=device) for _ in range(3))
    with torch.no_grad():
        for fn in (transposed, concatenated):
            torch._dynamo.reset()
            out, want = torch.compile(fn, backend="smelt")(q, k, v), fn(q, k, v)
            torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
            assert out.stride() == want.stride()
    assert len(kernel_runs) == 2


def test_operands_written_in_place_inside_the_chain_leave_it_as_written(device, kernel_runs, short_kernel):
    """The call reads its operands where the chain's last op runs; eager read them earlier."""
    def query_written(x, k, v, bias):
        q = x * 0.25
        x.add_(1.0)
        return (q @ k.transpose(-2, -1) + bias).softmax(-1) @ v

    def term_written(q, k, v, bias):
        s = q @ k.transpose(-2, -1) + bias
        bias.mul_(0)
        return s.softmax(-1) @ v
    torch.manual_seed(0)
    x, k, v = (torch.randn(2, 3, 8, 16, device=device) for _ in range(3))
    bias = torch.randn(3, 8, 8, device=device)
    with torch.no_grad():
        for fn in (query_written, term_written):
            torch._dynamo.reset()
            want = fn(x.clone(), k, v, bias.clone())
            torch.testing.assert_close(torch.compile(fn, backend="smelt")(x.clone(), k, v, bias.clone()), want,
                                       atol=1e-5, rtol=1e-5)
    assert kernel_runs == []


def test_an_operand_written_before_the_chain_is_read_after_the_write(device, kernel_runs, short_kernel):
    """A cache updated in place before the attention reads it (decode's key cache) is no hazard."""
    def cached(q, k_cache, v, k_new):
        k_cache[:, :, -1:] = k_new
        return ((q @ k_cache.transpose(-2, -1)) * 0.25).softmax(-1) @ v
    torch.manual_seed(0)
    q, cache, v = (torch.randn(2, 3, 8, 16, device=device) for _ in range(3))
    k_new = torch.randn(2, 3, 1, 16, device=device)
    with torch.no_grad():
        want = cached(q, cache.clone(), v, k_new)
        torch.testing.assert_close(torch.compile(cached, backend="smelt")(q, cache.clone(), v, k_new), want,
                                   atol=1e-5, rtol=1e-5)
    assert len(kernel_runs) == 1


def test_two_terms_gradients_do_not_share_memory(device):
    q, k, v = (torch.randn(2, 2, 8, 16, device=device, requires_grad=True) for _ in range(3))
    t0, t1 = (torch.randn(2, 2, 8, 8, device=device, requires_grad=True) for _ in range(2))
    short_attention(q, k, v, [t0, t1], 1.0, 1.0, False, False, False).sum().backward()
    assert t0.grad.data_ptr() != t1.grad.data_ptr()
    torch.testing.assert_close(t0.grad, t1.grad)


def test_no_keys_are_not_taken():
    from smelt.runtime.short_attention import applies
    q, k = torch.randn(2, 4, 16), torch.randn(2, 0, 16)
    assert not applies(q, k, torch.randn(2, 0, 16), []) and applies(q, q, q, [])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_a_float32_softmax_cast_back_has_eagers_gradients(device, dtype, kernel_runs, short_kernel):
    """Llama's form saves the float32 probabilities for softmax's backward: the kernel's backward
    reads them unrounded too (rounded, float16 gradients were 2e-3 off eager's)."""
    def float32_softmax(q, k, v, b):
        return torch.softmax((q @ k.transpose(-2, -1)) * 0.25 + b, -1, dtype=torch.float32).to(q.dtype) @ v
    torch.manual_seed(0)
    base = [torch.randn(2, 3, 33, 32, device=device, dtype=dtype) for _ in range(3)]
    base.append(torch.randn(3, 33, 33, device=device, dtype=dtype))
    eager, compiled = ([t.clone().requires_grad_() for t in base] for _ in range(2))
    out = float32_softmax(*eager)
    grad = torch.randn_like(out)
    out.backward(grad)
    torch.compile(float32_softmax, backend="smelt")(*compiled).backward(grad)
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got.grad, want.grad, atol=2.5e-4 if dtype == torch.float16 else 8e-3, rtol=0)
    assert len(kernel_runs) == 2


def test_an_attention_whose_query_is_the_last_ones_output(device, kernel_runs, short_kernel):
    """The second chain reads a node the first rewrite made (and k's memory has a writer, before
    both chains: the hazard check looks at where that node stands)."""
    def stacked(q, k, v):
        k.mul_(1.0)
        first = ((q @ k.transpose(-2, -1)) * 0.25).softmax(-1) @ v
        return ((first @ k.transpose(-2, -1)) * 0.25).softmax(-1) @ v
    q, k, v = (torch.randn(2, 3, 8, 16, device=device) for _ in range(3))
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(stacked, backend="smelt")(q, k, v), stacked(q, k, v),
                                   atol=1e-5, rtol=1e-5)
    assert len(kernel_runs) == 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("terms", [1, 2])
def test_float32_terms_of_half_q_keep_float32_scores(device, dtype, terms):
    """Half-float scores plus float32 terms are float32 (type promotion; autocast's Swin adds its
    float32 bias table so): the terms add and the softmax runs unrounded, the probabilities are
    rounded for the product, and the terms' gradient is float32 (before rounding for q and k's)."""
    torch.manual_seed(0)
    lead, n = (2, 3), 49
    q, k, v = (torch.randn(*lead, n, 32, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    # Offset by 64, where bfloat16's spacing is 0.5: scores rounded after the add would be far off.
    bias = (torch.randn(3, n, n, device=device) + 64).requires_grad_()
    mask = torch.where(torch.rand(2, 1, n, n, device=device) < 0.2, -100.0, 0.0)
    shapes = [bias.expand(*lead, n, n), mask.expand(*lead, n, n)][:terms]

    def eager(q, k, v):
        s = (q * 0.25) @ k.transpose(-2, -1)
        for t in shapes:
            s = s + t
        return s.softmax(-1).to(dtype) @ v
    expected = eager(q, k, v)
    grad = torch.randn_like(expected)
    want = torch.autograd.grad(expected, [q, k, v, bias], grad)
    out = short_attention(q, k, v, shapes, 0.25, 1.0, False, False, True)
    got = torch.autograd.grad(out, [q, k, v, bias], grad)
    _close(out, expected, dtype)
    assert got[3].dtype == torch.float32  # and unrounded: within float32's few ulps of eager's softmax
    torch.testing.assert_close(got[3], want[3], atol=1e-3 * want[3].abs().max().item(), rtol=0)
    tolerance = 5e-3 if dtype == torch.float16 else 3e-2
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), atol=tolerance * (1 + w.abs().max().item()), rtol=tolerance)


def test_mixed_term_dtypes_are_not_taken():
    from smelt.runtime.short_attention import applies
    q = torch.randn(2, 8, 16, dtype=torch.bfloat16)
    s = torch.randn(2, 8, 8)
    assert applies(q, q, q, [s, s]) and applies(q, q, q, [s.bfloat16()])
    assert not applies(q, q, q, [s.bfloat16(), s]) and not applies(q, q, q, [s.half()])


def test_swins_training_under_autocast_runs_through_the_kernel(device, kernel_runs, short_kernel):
    """Autocast's Swin: bfloat16 products, the float32 bias table and mask promote the scores to
    float32, softmax float32, its probabilities cast for the product with v. Gradients of the input,
    the projections and the table are eager's under autocast."""
    torch.manual_seed(0)
    model = WindowAttention(dim=32, heads=2, window=4, windows=2).to(device)
    x = torch.randn(4, 16, 32, device=device, requires_grad=True)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        expected = _training_gradients(model, x, compiled=False)
        got = _training_gradients(model, x, compiled=True)
    for g, want in zip(got, expected):
        torch.testing.assert_close(g.float(), want.float(), atol=3e-2 * (1 + want.abs().max().item()), rtol=3e-2)
    assert len(kernel_runs) == 2  # the forward and its backward


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_a_half_softmax_of_promoted_scores_is_eagers(device, dtype, short_kernel):
    """softmax(dtype=<half>) of scores a float32 term promoted rounds them to the half float
    first, which the kernel does not: such a chain stays as written (a review found the kernel
    taking it, 0.19 off eager's at a bias near 64)."""
    def chain(q, k, v, bias):
        return F.softmax(q @ k.transpose(-2, -1) * 0.25 + bias, dim=-1, dtype=dtype) @ v
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 16, device=device, dtype=dtype) for _ in range(3))
    bias = torch.randn(2, 16, 16, device=device) + 64
    with torch.no_grad():
        _close(torch.compile(chain, backend="smelt")(q, k, v, bias), chain(q, k, v, bias), dtype)


@pytest.mark.parametrize("divides", [False, True], ids=["times", "divided"])
def test_a_scaled_scores_gradient_rounds_before_the_scale(device, divides):
    """Eager rounds softmax's backward to bfloat16, then the scale's backward rounds again: on the
    CPU q's and k's gradients are eager's bit for bit but for a few products summed in another
    order (scaled before the rounding, a third to a half of them differed by an ulp)."""
    if device != "cpu":
        pytest.skip("the GPU's products sum in another order than eager's")
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 12, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    bias = torch.randn(2, 12, 12, dtype=torch.bfloat16).expand(2, 2, 12, 12)
    expected = _chain(q, k, v, [bias], score_scale=3.0, divides=divides)
    grad = torch.randn_like(expected)
    want = torch.autograd.grad(expected, [q, k, v], grad)
    out = short_attention(q, k, v, [bias], 1.0, 3.0, divides, False, False)
    got = torch.autograd.grad(out, [q, k, v], grad)
    for g, w in zip(got, want):
        assert (g != w).float().mean() < 0.05, (g != w).float().mean()
        torch.testing.assert_close(g.float(), w.float(), atol=1e-2, rtol=1e-2)


def test_float32_q_whose_product_autocast_halves_is_not_taken(device, kernel_runs, short_kernel):
    """float32 q and k under autocast make half-float scores, a float32 bias promotes them back:
    the chain's scores are not q's dtype, so neither SDPA nor the kernel stands for it."""
    def chain(q, k, v, bias):
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            s = q @ k.transpose(-2, -1) + bias
        return s.softmax(-1) @ v
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 16, device=device) for _ in range(3))
    bias = torch.randn(2, 16, 16, device=device)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(chain, backend="smelt")(q, k, v, bias), chain(q, k, v, bias))
    assert kernel_runs == []


def test_a_matrix_wider_than_int32_offsets_is_not_taken(tmp_path):
    """The kernel walks a matrix's rows in int32: a view whose rows lie 2**31 elements apart (a
    sparse file maps it) stays as written, and the op itself refuses it (the interpreter crashed)."""
    from smelt.runtime.short_attention import applies
    rows, d, stride = 64, 16, 2 ** 25 + 2 ** 20  # the last row starts past 2**31
    numel = (rows - 1) * stride + d
    path = tmp_path / "sparse.bin"
    with open(path, "wb") as f:
        f.truncate(numel * 4)
    try:
        storage = torch.from_file(str(path), shared=True, size=numel, dtype=torch.float32)
    except RuntimeError as e:
        pytest.skip(f"no sparse 8 GiB mapping here: {e}")
    q = storage.as_strided((1, rows, d), (0, stride, 1), 0)
    k = v = torch.randn(1, 8, d)
    assert applies(q[:, :32], k, v, []) and not applies(q, k, v, [])
    with pytest.raises(ValueError, match="does not take q"):
        short_attention(q, k, v, [], 1.0, 1.0, False, False, False)
