"""Copies before a fused attention kernel are dropped where it reads the copied view as it is
(lowering/fx_clones.py): Whisper and BART write `.transpose(1, 2).contiguous()` for the query, key
and value and again for the output, four copies of a layer's activations a layer. Traced on fake
CUDA tensors (no GPU needed); tests/gpu/test_attention_copies.py runs the graph against eager."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import smelt
from smelt.lowering.fx_clones import drop_copies_before_layout_free_readers
from smelt.pipeline import generate_graph

aten = torch.ops.aten
B, T, H, D = 2, 64, 6, 64


def heads_first(x):
    # [B * T, H * D] -> [B, H, T, D], copied as Whisper's attention does
    return aten.clone.default(aten.transpose.int(aten.view.default(x, [B, T, H, D]), 1, 2),
                              memory_format=torch.contiguous_format)


def whisper_attention(x, wq, wk, wv, wo, op):
    rows = aten.view.default(x, [B * T, H * D])
    q = heads_first(aten.mul.Tensor(aten.mm.default(rows, wq), 0.125))
    k = heads_first(aten.mm.default(rows, wk))
    v = heads_first(aten.mm.default(rows, wv))
    if op is aten._scaled_dot_product_cudnn_attention.default:  # as Whisper's graph calls it
        out = op(q, k, v, None, False, scale=1.0)[0]
    elif op is aten._scaled_dot_product_efficient_attention.default:
        out = op(q, k, v, None, False)[0]
    else:
        out = op(q, k, v)[0]
    back = aten.clone.default(aten.transpose.int(out, 1, 2), memory_format=torch.contiguous_format)
    return (aten.mm.default(aten.view.default(back, [B * T, H * D]), wo),)


def _traced(fn, dtype=torch.bfloat16):
    with FakeTensorMode():
        args = [torch.empty(B, T, H * D, dtype=dtype, device="cuda")] + \
               [torch.empty(H * D, H * D, dtype=dtype, device="cuda") for _ in range(4)]
        return make_fx(fn)(*args)


def _result(gm):
    out = gm.graph.output_node().args[0]
    return out[0] if isinstance(out, (list, tuple)) else out


def _clones(gm):
    return gm.graph.find_nodes(op="call_function", target=aten.clone.default)


OPS = [aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_efficient_attention.default,
       aten._scaled_dot_product_flash_attention.default]


@pytest.mark.smelt_only
@pytest.mark.cpu_backend_independent
@pytest.mark.parametrize("op", OPS, ids=["cudnn", "efficient", "flash"])
def test_the_copies_around_attention_go_and_the_output_keeps_its_traced_layout(op):
    gm = _traced(lambda x, wq, wk, wv, wo: whisper_attention(x, wq, wk, wv, wo, op))
    want = _result(gm).meta["val"].stride()
    assert len(_clones(gm)) == 4
    assert drop_copies_before_layout_free_readers(gm) == 4
    assert not _clones(gm), gm.code
    (attention,) = gm.graph.find_nodes(op="call_function", target=op)
    out = attention.meta["val"][0]
    assert out.transpose(1, 2).is_contiguous(), out.stride()  # the query's layout, [B, T, H, D] in memory
    assert _result(gm).meta["val"].stride() == want
    with smelt.config.override(cuda_backend="triton"):
        g = generate_graph(gm, "inference", smelt.config.current())
    # The query's scale is the one kernel left: no copies.
    assert len([k for k in g.kernels if not k.interpret]) == 1, g.wrapper_source


@pytest.mark.smelt_only
@pytest.mark.cpu_backend_independent
def test_copies_stay_where_a_view_is_not_in_whole_vectors_or_something_else_reads_them():
    op = aten._scaled_dot_product_cudnn_attention.default

    def odd_offset(x, wq, wk, wv, wo):  # the key starts 2 bytes into its rows' storage
        rows = aten.view.default(x, [B * T, H * D])
        q = heads_first(aten.mm.default(rows, wq))
        wide = aten.mm.default(rows, aten.cat.default([wk, aten.slice.Tensor(wk, 1, 0, 1)], 1))
        k = aten.clone.default(aten.transpose.int(aten.view.default(
            aten.slice.Tensor(wide, 1, 1, H * D + 1), [B, T, H, D]), 1, 2), memory_format=torch.contiguous_format)
        return (aten.sum.default(op(q, k, q, None, False)[0]),)

    def also_returned(x, wq, wk, wv, wo):  # the caller gets the copy: it stays a tensor of its own
        q = heads_first(aten.mm.default(aten.view.default(x, [B * T, H * D]), wq))
        return op(q, q, q, None, False)[0], q

    def output_saved(x, wq, wk, wv, wo):  # a forward saving cuDNN's output for its backward
        q = heads_first(aten.mm.default(aten.view.default(x, [B * T, H * D]), wq))
        return (op(q, q, q, None, False)[0],)

    gm = _traced(output_saved)
    traced = _result(gm).meta["val"]
    # Without the copy its layout would change, and the backward was traced with the old one.
    assert drop_copies_before_layout_free_readers(gm) == 0 and len(_clones(gm)) == 1
    assert _result(gm).meta["val"] is traced
    gm = _traced(odd_offset)
    drop_copies_before_layout_free_readers(gm)
    assert len(_clones(gm)) == 1  # the query's went, the key's stayed
    gm = _traced(also_returned)
    assert drop_copies_before_layout_free_readers(gm) == 0 and len(_clones(gm)) == 1


def trained_attention(x, wq, wk, wv, wo, grad):
    # A training graph's attention as AOTAutograd's joint graph has it: the forward, then cuDNN's
    # backward reading the same copies, and each gradient's way back to its projection's rows.
    rows = aten.view.default(x, [B * T, H * D])
    q, k, v = (heads_first(aten.mm.default(rows, w)) for w in (wq, wk, wv))
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = aten._scaled_dot_product_cudnn_attention.default(
        q, k, v, None, True, scale=1.0)
    back = aten.clone.default(aten.transpose.int(out, 1, 2), memory_format=torch.contiguous_format)
    y = aten.mm.default(aten.view.default(back, [B * T, H * D]), wo)
    grad_out = aten.transpose.int(aten.view.default(aten.mm.default(grad, aten.t.default(wo)), [B, T, H, D]), 1, 2)
    grads = aten._scaled_dot_product_cudnn_attention_backward.default(
        grad_out, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, False, scale=1.0)
    return (y, *(aten.mm.default(aten.t.default(rows), aten.view.default(aten.clone.default(
        aten.transpose.int(d, 1, 2), memory_format=torch.contiguous_format), [B * T, H * D])) for d in grads))


@pytest.mark.smelt_only
@pytest.mark.cpu_backend_independent
def test_training_drops_the_copies_in_both_directions():
    with FakeTensorMode():
        args = [torch.empty(B, T, H * D, dtype=torch.bfloat16, device="cuda")] + \
               [torch.empty(H * D, H * D, dtype=torch.bfloat16, device="cuda") for _ in range(4)] + \
               [torch.empty(B * T, H * D, dtype=torch.bfloat16, device="cuda")]
        gm = make_fx(trained_attention)(*args)
    assert len(_clones(gm)) == 7
    # q, k, v's copies, then the gradients' (in the views' layout now); the output's stays: the
    # backward reads the output too (a copy of a value others read is kept).
    assert drop_copies_before_layout_free_readers(gm) == 6
    (backward,) = gm.graph.find_nodes(op="call_function", target=aten._scaled_dot_product_cudnn_attention_backward.default)
    assert all(g.transpose(1, 2).is_contiguous() for g in backward.meta["val"])
