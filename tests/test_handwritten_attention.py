"""Attention written by hand runs as one SDPA call (lowering/handwritten_attention.py): each form a
model writes it in is found, the values and gradients are eager's, and a chain that is not plain
attention (its probabilities read elsewhere, dropout that drops, a masked_fill) is left as written."""
import math
import random

import pytest
import torch
import torch.nn.functional as F

import smelt.config
from smelt.lowering import handwritten_attention
from smelt.lowering.handwritten_attention import handwritten_attention_to_sdpa


@pytest.fixture(autouse=True)
def _every_length(monkeypatch):
    monkeypatch.setattr(handwritten_attention, "MIN_KEYS", {})  # the tests' rows are short
    monkeypatch.setattr(handwritten_attention, "SHORT_KEYS", 0)  # SDPA's path (test_short_attention: the other)


def _qkv(device, dtype=torch.float32, batch=(2, 3), queries=8, keys=8, dim=16, grad=False):
    torch.manual_seed(0)
    q = torch.randn(*batch, queries, dim, device=device, dtype=dtype)
    k = torch.randn(*batch, keys, dim, device=device, dtype=dtype)
    v = torch.randn(*batch, keys, dim, device=device, dtype=dtype)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def _padding_mask(device, dtype, keys=8):
    """ALBERT's: 0 where a key is kept, the dtype's lowest value where it is padding."""
    keep = torch.ones(2, 1, 1, keys, dtype=torch.bool, device=device)
    keep[1, ..., keys - 3:] = False
    return torch.where(keep, torch.zeros((), dtype=dtype, device=device), torch.finfo(dtype).min)


def albert(q, k, v, mask):  # transformers' eager_attention_forward
    w = torch.matmul(q, k.transpose(2, 3)) * q.size(-1) ** -0.5
    w = w + mask
    w = F.softmax(w, dim=-1)
    w = F.dropout(w, p=0.1, training=False)
    return torch.matmul(w, v)


def divided_methods(q, k, v, mask):  # older BERT code: a division, methods, `@`
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return (mask + scores).softmax(-1) @ v


def float32_softmax(q, k, v, mask):  # Llama's eager form: the softmax in float32, cast back
    w = torch.matmul(q, k.transpose(2, 3)) * 0.25 + mask
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v)


def unscaled_unmasked(q, k, v, mask):
    return torch.softmax(torch.matmul(q, k.transpose(-2, -1)), dim=-1).matmul(v) + mask.sum()


def three_dimensional(q, k, v, mask):  # bmm over folded heads, k given already transposed
    q, k_t, v = q.flatten(0, 1), k.flatten(0, 1).transpose(1, 2).contiguous(), v.flatten(0, 1)
    return torch.bmm(F.softmax(torch.bmm(q, k_t) * 0.3, dim=-1), v)


FORMS = [albert, divided_methods, float32_softmax, unscaled_unmasked, three_dimensional]


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.__name__)
def test_each_form_runs_as_one_sdpa_call_with_eagers_values(device, compile_fn, assert_close, rewrites, form):
    q, k, v = _qkv(device)
    mask = _padding_mask(device, q.dtype)
    assert_close(compile_fn(form)(q, k, v, mask), form(q, k, v, mask), atol=1e-5, rtol=1e-5)
    assert rewrites == [1]


@pytest.mark.parametrize("form", [albert, float32_softmax], ids=lambda f: f.__name__)
def test_bfloat16_attention_agrees_to_its_precision(device, compile_fn, assert_close, rewrites, form):
    q, k, v = _qkv(device, torch.bfloat16)
    mask = _padding_mask(device, q.dtype)
    expected = form(*(t.double() for t in (q, k, v)), mask.double())
    assert_close(compile_fn(form)(q, k, v, mask).double(), expected, atol=2e-2, rtol=2e-2)
    assert rewrites == [1]


@pytest.mark.parametrize("form", [albert, divided_methods, three_dimensional], ids=lambda f: f.__name__)
def test_training_gradients_are_eagers(device, compile_fn, assert_close, rewrites, form):
    """The rewrite happens before AOTAutograd: the backward is SDPA's."""
    q, k, v = _qkv(device, grad=True)
    mask = _padding_mask(device, q.dtype)
    (form(q, k, v, mask) ** 2).sum().backward()
    expected = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    (compile_fn(form)(q, k, v, mask) ** 2).sum().backward()
    for t, want in zip((q, k, v), expected):
        assert_close(t.grad, want, atol=1e-4, rtol=1e-4)
    assert rewrites == [1]


def probabilities_returned(q, k, v, mask):  # output_attentions=True: the probabilities are a result
    w = F.softmax(torch.matmul(q, k.transpose(2, 3)) * 0.25 + mask, dim=-1)
    return torch.matmul(w, v), w


def dropout_that_drops(q, k, v, mask):
    w = F.softmax(torch.matmul(q, k.transpose(2, 3)) * 0.25 + mask, dim=-1)
    return torch.matmul(F.dropout(w, p=0.5, training=True), v)


def masked_fill(q, k, v, mask):  # a row masked whole is NaN in eager: not every SDPA kernel says so
    w = torch.matmul(q, k.transpose(2, 3)).masked_fill(mask < 0, float("-inf"))
    return torch.matmul(F.softmax(w, dim=-1), v)


def softmax_over_queries(q, k, v, mask):
    return torch.matmul(F.softmax(torch.matmul(q, k.transpose(2, 3)) + mask, dim=-2), v)


def broadcast_keys(q, k, v, mask):  # matmul broadcasts batch dimensions; SDPA is not asked to
    return torch.matmul(F.softmax(torch.matmul(q, k[:1].transpose(2, 3)), dim=-1), v[:1])


def scores_doubled(q, k, v, mask):  # an add of the scores to themselves is not a mask
    s = torch.matmul(q, k.transpose(2, 3))
    return torch.matmul(F.softmax(s + s, dim=-1), v)


def scores_read_twice(q, k, v, mask):
    s = torch.matmul(q, k.transpose(2, 3))
    return torch.matmul(F.softmax(s, dim=-1), v), s.amax()


@pytest.mark.parametrize("form", [probabilities_returned, masked_fill, softmax_over_queries, broadcast_keys,
                                  scores_read_twice, scores_doubled], ids=lambda f: f.__name__)
def test_chains_that_are_not_plain_attention_are_left_as_written(device, compile_fn, assert_close, rewrites, form):
    q, k, v = _qkv(device)
    mask = _padding_mask(device, q.dtype)
    assert_close(compile_fn(form)(q, k, v, mask), form(q, k, v, mask), atol=1e-5, rtol=1e-5)
    assert rewrites == [0]


def test_a_float32_softmax_of_float64_scores_is_left_as_written(device, compile_fn, assert_close, rewrites):
    # The softmax rounds the scores to float32 (here past its range: NaN rows); SDPA in float64 would not.
    q, k, v = (t.double() for t in _qkv(device))

    def attention(q, k, v):
        return F.softmax(torch.matmul(q, k.transpose(2, 3)) * 1e39, dim=-1, dtype=torch.float32).to(torch.float64) @ v

    assert_close(compile_fn(attention)(q, k, v), attention(q, k, v))  # NaN where eager has NaN
    assert rewrites == [0]


def test_dropout_that_drops_is_left_as_written(device, rewrites):
    q, k, v = _qkv(device)
    torch.compile(dropout_that_drops, backend="smelt")(q, k, v, _padding_mask(device, q.dtype))
    assert rewrites == [0]


def test_the_setting_turns_it_off(device, compile_fn, assert_close, rewrites):
    q, k, v = _qkv(device)
    mask = _padding_mask(device, q.dtype)
    with smelt.config.override(attention_rewrite=False):
        assert_close(compile_fn(albert)(q, k, v, mask), albert(q, k, v, mask), atol=1e-5, rtol=1e-5)
    assert rewrites == []


def test_the_dynamo_graph_holds_one_sdpa_call_and_no_softmax(device):
    graphs = []

    def capture(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm
    q, k, v = _qkv(device)
    mask = _padding_mask(device, q.dtype)
    torch.compile(albert, backend=capture, fullgraph=True)(q, k, v, mask)
    ((gm, inputs),) = graphs
    assert handwritten_attention_to_sdpa(gm) == 1
    targets = [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert F.scaled_dot_product_attention in targets
    assert not {F.softmax, torch.matmul, "transpose", F.dropout} & set(targets), targets
    torch.testing.assert_close(gm(*inputs)[0], albert(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_albert_from_transformers(device, assert_close, rewrites):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.AlbertConfig(vocab_size=64, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                             embedding_size=16, num_hidden_layers=2, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0)
    config._attn_implementation = "eager"
    model = tf.AlbertForMaskedLM(config).to(device).eval()
    ids = torch.randint(0, 64, (2, 12), device=device)
    attention_mask = torch.ones(2, 12, dtype=torch.long, device=device)
    attention_mask[1, 9:] = 0
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=attention_mask).logits
        actual = torch.compile(lambda i, a: model(input_ids=i, attention_mask=a).logits, backend="smelt")(
            ids, attention_mask)
    assert_close(actual, expected, atol=1e-4, rtol=1e-4)
    assert rewrites == [2]  # one layer's weights used twice: two attentions


def test_a_dynamic_sequence_length_compiles_once_and_is_rewritten(device, assert_close, rewrites):
    f = torch.compile(albert, backend="smelt")
    for keys in (8, 12, 17):
        q, k, v = _qkv(device, queries=keys, keys=keys)
        mask = _padding_mask(device, q.dtype, keys=keys)
        for t in (q, k, v):
            torch._dynamo.mark_dynamic(t, 2)
        torch._dynamo.mark_dynamic(mask, 3)
        assert_close(f(q, k, v, mask), albert(q, k, v, mask), atol=1e-5, rtol=1e-5)
    assert rewrites == [1]


def test_a_chain_sdpa_fails_to_trace_is_left_as_written(device, assert_close, rewrites, monkeypatch):
    """An SDPA call whose example value cannot be computed (on CUDA before the Python dispatcher: a
    mask of symbolic length) leaves the chain as written, not a failed compile."""
    import smelt.lowering.handwritten_attention as attention
    real = attention.call_node

    def failing_sdpa(gm, target, *args, **kwargs):
        if target is F.scaled_dot_product_attention:
            raise RuntimeError("SymIntArrayRef expected to contain only concrete integers")
        return real(gm, target, *args, **kwargs)
    monkeypatch.setattr(attention, "call_node", failing_sdpa)
    q, k, v = _qkv(device)
    mask = _padding_mask(device, q.dtype)
    assert_close(torch.compile(albert, backend="smelt")(q, k, v, mask), albert(q, k, v, mask), atol=1e-5, rtol=1e-5)
    assert rewrites == [0]


@pytest.mark.parametrize("queries,keys", [(1, 8), (8, 1), (4, 0), (0, 4)])
def test_one_or_no_queries_or_keys(device, compile_fn, assert_close, rewrites, queries, keys):
    """A decode step's one query, one key, and none: eager's values (zeros over no keys)."""
    q, k, v = _qkv(device, queries=queries, keys=keys)
    mask = torch.zeros(2, 1, 1, keys, device=device)
    assert_close(compile_fn(albert)(q, k, v, mask), albert(q, k, v, mask), atol=1e-5, rtol=1e-5)
    assert rewrites == [1]


def test_a_learned_additive_bias_gets_eagers_gradient(device, compile_fn, assert_close, rewrites):
    """A position bias the model learns (T5-like), added to the scores: SDPA's backward gives its gradient."""
    q, k, v = _qkv(device, grad=True)
    bias = torch.randn(1, 3, 8, 8, device=device, requires_grad=True)
    albert(q, k, v, bias).square().sum().backward()
    expected = [t.grad.clone() for t in (q, k, v, bias)]
    for t in (q, k, v, bias):
        t.grad = None
    compile_fn(albert)(q, k, v, bias).square().sum().backward()
    for t, want in zip((q, k, v, bias), expected):
        assert_close(t.grad, want, atol=1e-4, rtol=1e-4)
    assert rewrites == [1]


def _key_mask(device, batch=2, keys=8, whole_row=False):
    """DeBERTa's: True where a query may see a key, [batch, 1, queries, keys]; padding keys are
    masked and, with whole_row, one padded query's row too (all its keys)."""
    keep = torch.ones(batch, 1, keys, keys, dtype=torch.bool, device=device)
    keep[1, ..., keys - 3:] = False
    if whole_row:
        keep[1, :, keys - 1, :] = False
    return keep


def deberta(q, k, v, bias, keep):  # transformers' DisentangledSelfAttention, heads folded for bmm
    heads, dim = q.shape[1], q.shape[-1]
    q, k, v = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)
    scale = torch.sqrt(torch.tensor(dim, dtype=torch.float) * 3)
    scores = torch.bmm(q, k.transpose(-1, -2) / scale.to(dtype=q.dtype))
    scores = scores + bias.flatten(0, 1)
    scores = scores.view(-1, heads, scores.size(-2), scores.size(-1))
    scores = scores.masked_fill(~keep, torch.finfo(q.dtype).min)
    probs = F.dropout(F.softmax(scores, dim=-1), p=0.1, training=False)
    return torch.bmm(probs.view(-1, probs.size(-2), probs.size(-1)), v)


def filled_only(q, k, v, bias, keep):  # a masked_fill of the lowest value, nothing added
    scores = torch.matmul(q, k.transpose(-1, -2)) * 0.25
    return F.softmax(scores.masked_fill(~keep, torch.finfo(q.dtype).min), dim=-1) @ v


@pytest.mark.parametrize("form", [deberta, filled_only], ids=lambda f: f.__name__)
@pytest.mark.parametrize("whole_row", [False, True], ids=["padded_keys", "a_row_masked_whole"])
def test_a_masked_fill_of_the_lowest_value_runs_as_an_additive_mask(device, compile_fn, assert_close, rewrites,
                                                                     form, whole_row):
    """Values and gradients (the bias's too) are eager's; a row masked whole is uniform, as in eager."""
    q, k, v = _qkv(device, grad=True)
    bias = torch.randn(2, 3, 8, 8, device=device, requires_grad=True)
    keep = _key_mask(device, whole_row=whole_row)
    expected = form(q, k, v, bias, keep)
    (expected ** 2).sum().backward()
    want = [t.grad.clone() for t in (q, k, v, bias)] if form is deberta else [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v, bias):
        t.grad = None
    actual = compile_fn(form)(q, k, v, bias, keep)
    assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    (actual ** 2).sum().backward()
    for t, w in zip((q, k, v, bias), want):
        assert_close(t.grad, w, atol=1e-4, rtol=1e-4)
    assert rewrites == [1]


def filled_with_other_values(q, k, v, bias, keep):
    scores = torch.matmul(q, k.transpose(-1, -2))
    a = F.softmax(scores.masked_fill(~keep, -1e4), dim=-1) @ v  # not the lowest value: a score of its own
    b = F.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1) @ v  # a row masked whole would be NaN
    return a + b


def filled_before_the_bias(q, k, v, bias, keep):  # the bias added to the filled scores: not a mask
    scores = torch.matmul(q, k.transpose(-1, -2)).masked_fill(~keep, torch.finfo(q.dtype).min)
    return F.softmax(scores + bias, dim=-1) @ v


@pytest.mark.parametrize("form", [filled_with_other_values, filled_before_the_bias], ids=lambda f: f.__name__)
def test_other_masked_fills_are_left_as_written(device, compile_fn, assert_close, rewrites, form):
    q, k, v = _qkv(device)
    bias, keep = torch.randn(2, 3, 8, 8, device=device), _key_mask(device)
    assert_close(compile_fn(form)(q, k, v, bias, keep), form(q, k, v, bias, keep), atol=1e-5, rtol=1e-5)
    assert rewrites == [0]


def test_a_half_precision_fill_is_left_as_written(device, rewrites):
    """float16's lowest value plus a score can round to -inf: a row masked whole would be NaN."""
    q, k, v = _qkv(device, dtype=torch.float16)
    bias, keep = torch.randn(2, 3, 8, 8, device=device, dtype=torch.float16), _key_mask(device)
    torch.compile(deberta, backend="smelt")(q, k, v, bias, keep)
    assert rewrites == [0]


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_deberta_v2_from_transformers(device, assert_close, rewrites, training):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.DebertaV2Config(vocab_size=64, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                num_hidden_layers=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
                                max_relative_positions=-1, position_biased_input=False, norm_rel_ebd="layer_norm",
                                share_att_key=True)
    config._attn_implementation = "eager"
    model = tf.DebertaV2ForMaskedLM(config).to(device).train(training)
    ids = torch.randint(0, 64, (2, 12), device=device)
    attention_mask = torch.ones(2, 12, dtype=torch.long, device=device)
    attention_mask[1, 9:] = 0
    compiled = torch.compile(lambda i, a: model(input_ids=i, attention_mask=a).logits, backend="smelt")
    with torch.set_grad_enabled(training):
        expected = model(input_ids=ids, attention_mask=attention_mask).logits
        actual = compiled(ids, attention_mask)
        assert_close(actual, expected, atol=1e-4, rtol=1e-4)
    if training:
        expected.sum().backward()
        want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        actual.sum().backward()
        for n, p in model.named_parameters():
            if n in want:
                assert_close(p.grad, want[n], atol=1e-4, rtol=1e-4)
    assert rewrites == [2]


def test_an_entry_with_no_key_gets_eagers_values_and_v_gradient(device, compile_fn, assert_close, rewrites):
    """An additive mask at the lowest value on every key of an entry: eager's scores round to that value,
    its softmax is uniform, and SDPA's backward (its probabilities rebuilt from a log-sum-exp rounded
    the same way, each 1) gave v keys-times eager's gradient. The entry's query is zeroed instead: eager's
    values and v's gradient; q and k get none from it (eager's are the exact-arithmetic derivative at
    the rounded probabilities, of scores that no longer depend on q)."""
    q, k, v = _qkv(device, grad=True)
    mask = torch.zeros(2, 1, 1, 8, device=device)
    mask[1] = torch.finfo(torch.float32).min
    expected = albert(q, k, v, mask)
    (expected ** 2).sum().backward()
    want = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    actual = compile_fn(albert)(q, k, v, mask)
    assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    (actual ** 2).sum().backward()
    assert_close(v.grad, want[2], atol=1e-4, rtol=1e-4)
    for t, w in zip((q, k), want):
        assert_close(t.grad[0], w[0], atol=1e-4, rtol=1e-4)
        assert torch.count_nonzero(t.grad[1]) == 0
    assert rewrites == [1]


def _scale_on_q(q, k, v, mask):  # the scale applied to q before the product
    return torch.softmax((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1) + mask, dim=-1) @ v


def _random_case(seed: int, device):
    """A random chain (form, sizes down to one query or key, a mask of any broadcast shape: padding,
    random, learned, or a fill keeping a random share of keys) and the tensors it takes."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    b, h = rng.choice([1, 2, 3]), rng.choice([1, 2, 4])
    queries, keys, dim = rng.choice([1, 3, 8, 17]), rng.choice([1, 5, 8, 16]), rng.choice([4, 8, 16, 32])
    q, k, v = (torch.randn(b, h, n, dim, device=device, requires_grad=True) for n in (queries, keys, keys))
    leaves = [q, k, v]
    if rng.random() < 0.6:
        form = rng.choice([albert, divided_methods, float32_softmax, _scale_on_q])
        shape = rng.choice([(b, 1, 1, keys), (b, 1, queries, keys), (1, h, queries, keys), (b, h, queries, keys)])
        how = rng.choice(["padding", "random", "learned"])
        if how == "padding":
            keep = torch.rand(shape, device=device) > 0.3
            keep[..., 0] = True  # an entry with no key: its q and k gradients are a documented deviation
            mask = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
        else:
            mask = torch.randn(shape, device=device) * 3
            if how == "learned":
                leaves.append(mask.requires_grad_())
        return form, (q, k, v, mask), leaves
    form = rng.choice([deberta, filled_only])
    bias = torch.randn(b, h, queries, keys, device=device, requires_grad=form is deberta)
    if form is deberta:
        leaves.append(bias)
    shape = rng.choice([(b, 1, queries, keys), (b, 1, 1, keys), (b, h, queries, keys)])
    keep = torch.rand(shape, device=device) > rng.choice([0.2, 0.5, 0.9])
    return form, (q, k, v, bias, keep), leaves


@pytest.mark.parametrize("seed", range(8))
def test_random_chains_give_eagers_values_and_gradients(device, assert_close, rewrites, seed):
    """The class of the wrong gradients found before (rows with no key, broadcast masks): random
    forms, sizes and masks against eager (`seed` picks the case)."""
    form, args, leaves = _random_case(seed, device)
    expected = form(*args)
    grad_out = torch.randn_like(expected)
    want = torch.autograd.grad(expected, leaves, grad_out)
    actual = torch.compile(form, backend="smelt")(*args)
    assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    for got, w in zip(torch.autograd.grad(actual, leaves, grad_out), want):
        assert_close(got, w, atol=1e-4, rtol=1e-4)
    assert rewrites == [1]


def output_written_in_place(q, k, v, mask):
    out = torch.matmul(F.softmax(torch.matmul(q, k.transpose(2, 3)) * 0.25 + mask, dim=-1), v)
    out[:, :, ::2].clamp_(min=-0.5)
    return out.clone()


def test_an_output_written_in_place_is_left_as_written_and_trains(device, compile_fn, assert_close, rewrites):
    """SDPA's kernels save their output for the backward: rewritten, a chain whose output the
    program then writes in place failed AOTAutograd's trace ("modified by an inplace operation"),
    on the CPU too (found beside the fuzzer's SDPA case, seed 0 program 88)."""
    q, k, v = _qkv(device, grad=True)
    mask = _padding_mask(device, q.dtype)
    out = output_written_in_place(q, k, v, mask)
    out.sum().backward()
    expected = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    got = compile_fn(output_written_in_place)(q, k, v, mask)
    got.sum().backward()
    assert_close(got, out, atol=1e-5, rtol=1e-5)
    for t, want in zip((q, k, v), expected):
        assert_close(t.grad, want, atol=1e-4, rtol=1e-4)
    assert rewrites == [0]


@pytest.mark.parametrize("keys, rewritten", [(49, 0), (64, 1)])
def test_rows_shorter_than_a_fused_kernels_tile_are_left_as_written(device, compile_fn, assert_close, rewrites,
                                                                    monkeypatch, keys, rewritten):
    """Swin's 49-key windows: faster as written than through SDPA's kernels on the GPU."""
    monkeypatch.setattr(handwritten_attention, "MIN_KEYS", {torch.device(device).type: 64})
    q, k, v = _qkv(device, queries=keys, keys=keys)
    mask = torch.zeros(2, 1, 1, keys, device=device)
    assert_close(compile_fn(albert)(q, k, v, mask), albert(q, k, v, mask), atol=1e-5, rtol=1e-5)
    assert rewrites == [rewritten]


def test_a_mask_written_in_place_inside_the_chain_leaves_it_as_written(device, assert_close, rewrites):
    """SDPA's call reads the mask where the chain's last product runs; eager read it before the write."""
    def mask_written(q, k, v, mask):
        s = torch.matmul(q, k.transpose(2, 3)) * 0.25 + mask
        mask.mul_(0)
        return torch.matmul(F.softmax(s, dim=-1), v)
    q, k, v = _qkv(device)
    mask = _padding_mask(device, q.dtype)
    with torch.no_grad():
        want = mask_written(q, k, v, mask.clone())
        assert_close(torch.compile(mask_written, backend="smelt")(q, k, v, mask.clone()), want, atol=1e-5, rtol=1e-5)
    assert rewrites == [0]
