"""A cat's storage is allocated where the program makes the cat, not where its first input is
ready. DenseNet concatenates every earlier feature before each layer; copying a new feature into
all the later cats of its block in one kernel (one read, many writes) allocated every cat of the
block at its start: 162 MiB at once against eager's 154 (bf16 inference, batch 32, H200)."""
import pytest
import torch
import torch.nn.functional as F

import smelt
from conftest import DEVICE

pytestmark = pytest.mark.smelt_only

LAYERS, GROWTH, FIRST, HW = 8, 8, 16, 48  # the last cat 1.5 MiB: past what the combo pass moves freely


def _dense_block(x, *weights):
    features = [x]
    for w in weights:
        features.append(F.conv2d(torch.relu(torch.cat(features, 1)), w))
    return torch.cat(features, 1).sum()


def _stored_cats(x, *weights):
    # The convolution reads each cat from memory: every cat is stored, its inputs copied into it.
    features = [x]
    for w in weights:
        features.append(torch.relu(F.conv2d(torch.cat(features, 1), w)))
    return torch.cat(features, 1).sum()


# The rule holds a join back only before an ATen call. With these 1x1 convolutions as smelt's
# reductions (lowering/small_products.py, SMELT_SMALL_PRODUCTS=on: sizes this small), no call follows,
# and the first kernel allocates the block's last cat again (3.8 MiB planned against 2.9). Real
# DenseNets' products are past the limit (batch 1: 12.8M multiply-adds and more) and stay calls.
_PRODUCTS_AS_REDUCTIONS = pytest.mark.xfail(strict=True, reason="the allocate-early rule looks only at ATen calls")


# The known failure is the scheduler's rule, whatever the kernels: shown once, in the Halide pass (under
# Triton's interpreter its products as reductions took 30 s a case of the suite's budget).
@pytest.mark.parametrize("small_products", [
    "off", pytest.param("on", marks=[_PRODUCTS_AS_REDUCTIONS, pytest.mark.cpu_backend_independent])])
@pytest.mark.parametrize("block", [_dense_block, _stored_cats], ids=["relu_of_cat", "stored_cats"])
def test_each_cat_of_a_dense_block_lives_only_around_its_layer(observe, block, small_products):
    torch.manual_seed(0)
    x = torch.randn(2, FIRST, HW, HW, device=DEVICE)
    weights = [torch.randn(GROWTH, FIRST + GROWTH * k, 1, 1, device=DEVICE) / 8 for k in range(LAYERS)]
    torch._dynamo.reset()
    observe.reset()
    with smelt.config.override(small_products=small_products):
        out = torch.compile(block, backend="smelt")(x, *weights)
    torch.testing.assert_close(out, block(x, *weights), atol=1e-3, rtol=1e-4)
    graph = observe.compiled_graphs()[-1]
    plane = 2 * HW * HW * 4  # bytes of one channel over the batch
    largest_cat = (FIRST + GROWTH * LAYERS) * plane
    every_cat = sum(FIRST + GROWTH * k for k in range(1, LAYERS + 1)) * plane
    # The features, one layer's relu of their cat and its product alive at once, as eager holds them
    # (1.8x the largest cat here); the last cat allocated with the block's first copy, 2.7x.
    assert graph.planned_peak_bytes <= 2 * largest_cat < every_cat, graph.wrapper_source


def _qkv_attention(x, w):
    batch, length, heads, width = 4, 64, 4, 32
    q, k, v = (x @ w).view(batch, length, 3, heads, width).permute(2, 0, 3, 1, 4)
    causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
    return (q @ k.transpose(-1, -2)).masked_fill(~causal, float("-inf")).softmax(-1) @ v


def test_copies_that_share_a_larger_input_stay_one_kernel(observe):
    """The rule weighs bytes: v's copy out of the fused q/k/v product is smaller than the product it
    shares with q's and k's copies, so it joins their kernel before the score product; apart, the
    whole product lived on to v's own copy (a review: peak 768 -> 896 KiB, one more kernel)."""
    x, w = torch.randn(4, 64, 128, device=DEVICE), torch.randn(128, 384, device=DEVICE) / 8
    torch._dynamo.reset()
    observe.reset()
    out = torch.compile(_qkv_attention, backend="smelt")(x, w)
    torch.testing.assert_close(out, _qkv_attention(x, w), atol=1e-4, rtol=1e-4)
    graph = observe.compiled_graphs()[-1]
    copies = [k for k in graph.kernel_names if "clone" in k and "amax" not in k]
    assert len(copies) == 1, graph.wrapper_source
