"""SDPA's mask made dense along its last dimension before AOTAutograd traces it
(lowering/attention_masks.py): on CUDA a strided mask sends SDPA down its math path."""
import pytest
import torch
import torch.nn.functional as F

import smelt  # noqa: F401
from conftest import DEVICE, dynamo_graph
from smelt.lowering.attention_masks import dense_attention_masks


def _attention_with_a_permuted_bias(q, k, v, bias):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.permute(0, 3, 1, 2))  # T5's position bias


@pytest.mark.parametrize("by_keyword", [True, False])
def test_a_strided_mask_is_copied_dense(by_keyword):
    """The pass itself, on a graph captured on the CPU and told the CPU is a device it applies to."""
    def positional(q, k, v, bias):
        return F.scaled_dot_product_attention(q, k, v, bias.permute(0, 3, 1, 2))
    fn = _attention_with_a_permuted_bias if by_keyword else positional
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    bias = torch.randn(1, 16, 16, 4)
    gm = dynamo_graph(fn, q, k, v, bias)
    assert dense_attention_masks(gm, devices=("cpu",)) == 1
    assert "contiguous" in gm.code
    given = {"q": q, "k": k, "v": v, "bias": bias}  # Dynamo orders the inputs by first use
    inputs = [given[n.name.removeprefix("l_").removesuffix("_")] for n in gm.graph.find_nodes(op="placeholder")]
    torch.testing.assert_close(gm(*inputs)[0], fn(q, k, v, bias))
    assert dense_attention_masks(gm, devices=("cpu",)) == 0  # already dense


def test_masks_left_alone_and_a_boolean_one_copied():
    """Dense masks are left as they are, and a mask on a device the pass leaves; a transposed
    boolean mask is copied too (the stride check does not look at the dtype)."""
    q = torch.randn(2, 4, 16, 8)

    def dense_and_boolean(q, bias, keep):
        return (F.scaled_dot_product_attention(q, q, q, attn_mask=bias)
                + F.scaled_dot_product_attention(q, q, q, attn_mask=keep)
                + F.scaled_dot_product_attention(q, q, q, attn_mask=keep.transpose(-1, -2)))
    keep = torch.rand(16, 16) > 0.2
    gm = dynamo_graph(dense_and_boolean, q, torch.randn(1, 4, 16, 16), keep)
    assert dense_attention_masks(gm, devices=("cpu",)) == 1
    gm = dynamo_graph(_attention_with_a_permuted_bias, q, q, q, torch.randn(1, 16, 16, 4))
    assert dense_attention_masks(gm) == 0  # CUDA only by default: the CPU's flash kernel takes strided masks


def test_t5_like_attention_matches_eager_with_its_gradients(device, compile_fn, assert_close):
    """Through smelt, forward and backward, the bias learned (T5's relative position embedding)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, device=device, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 16, 16, 4, device=device, requires_grad=True)
    expected = _attention_with_a_permuted_bias(q, k, v, bias)
    expected.square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v, bias)]
    for t in (q, k, v, bias):
        t.grad = None
    actual = compile_fn(_attention_with_a_permuted_bias)(q, k, v, bias)
    actual.square().sum().backward()
    assert_close(actual, expected, atol=1e-4, rtol=1e-4)
    for t, want in zip((q, k, v, bias), grads):
        assert_close(t.grad, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("write", ["clamp_", "setitem", "relu_inplace", "out"])
def test_an_output_written_in_place_keeps_its_strided_mask(write):
    """The fused kernels save SDPA's output for the backward, so a program writing that output in
    place, valid on eager's math path, failed AOTAutograd's trace once the dense mask chose them
    (fuzzer seed 0, program 88, on CUDA): such a call keeps its mask as it is."""
    def fn(q, k, v, bias):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.t())
        view = out[:, ::2]
        if write == "clamp_":
            view.clamp_(min=-0.5)
        elif write == "setitem":
            view[..., 0] = 0.0
        elif write == "relu_inplace":
            F.relu(view, inplace=True)
        else:
            torch.mul(view, 2, out=view)
        return out.clone()
    q = torch.randn(1, 2, 4, 4)
    kv = torch.randn(1, 2, 6, 4)
    gm = dynamo_graph(fn, q, kv, kv, torch.randn(6, 4))
    assert dense_attention_masks(gm, devices=("cpu",)) == 0


def test_an_sdpa_output_written_in_place_trains_as_in_eager(device, compile_fn, assert_close):
    """The fuzzer's program: a strided float mask, the output clamped in place through a view,
    backward on: eager runs SDPA's math path, the compile raised."""
    if torch.device(device).type != "cuda":
        pytest.skip("the CPU's flash kernel takes the strided mask and saves its output: eager raises too")

    def fn(q, k, v, mask):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out[:, ::2, ::2, :].clamp_(min=-0.5)
        return out.clone()
    torch.manual_seed(0)
    leaves = [torch.randn(1, 2, n, 4, device=device, requires_grad=True) for n in (4, 6, 6)]
    mask = torch.randn(6, 4, device=device).t()
    expected = fn(*leaves, mask)
    expected.sum().backward()
    grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    got = compile_fn(fn)(*leaves, mask)
    got.sum().backward()
    assert_close(got, expected)
    for t, g in zip(leaves, grads):
        assert_close(t.grad, g)
