"""A value a library call needs in memory is stored once and read back by its other readers, and a
library product runs in the dtype eager runs it in. nn.MultiheadAttention's head-averaged weights
(model suite, bf16 inference on the H200) peaked at 2.08x Inductor's: torch's decomposition of
baddbmm made the scores a float32 bmm, and the averaging kernel recomputed the softmax from them,
holding the scores alive beside the stored probabilities."""
import pytest
import torch

import smelt
from conftest import DEVICE

pytestmark = pytest.mark.smelt_only


def _compiled(fn, *args, observe):
    torch._dynamo.reset()
    observe.reset()
    out = torch.compile(fn, backend="smelt")(*args)
    return out, observe.compiled_graphs()[-1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_baddbmm_stays_one_library_call_in_its_dtype(observe, dtype):
    mask, a, b = (torch.randn(4, 1, 48, device=DEVICE, dtype=dtype), torch.randn(4, 32, 16, device=DEVICE, dtype=dtype),
                  torch.randn(4, 16, 48, device=DEVICE, dtype=dtype))

    def scores(mask, a, b):
        return torch.baddbmm(mask, a, b, beta=0.5, alpha=0.25).softmax(-1)

    out, graph = _compiled(scores, mask, a, b, observe=observe)
    torch.testing.assert_close(out, scores(mask, a, b), atol=2e-2, rtol=2e-2)
    assert "torch.baddbmm(" in graph.wrapper_source
    assert "torch.bmm(" not in graph.wrapper_source  # not the float32 product torch's decomposition makes
    # The scores and probabilities in the half-precision dtype: no float32 copy of the scores.
    assert graph.planned_peak_bytes <= 2 * 4 * 32 * 48 * dtype.itemsize + 4 * 32 * 4 * 2


def test_attention_weights_averaged_over_heads_read_the_stored_probabilities(observe):
    torch.manual_seed(0)
    batch, heads, length, source, width = 2, 2, 64, 128, 16
    attention = torch.nn.MultiheadAttention(width, heads, batch_first=True).to(DEVICE, torch.bfloat16).eval()
    query = torch.randn(batch, length, width, device=DEVICE, dtype=torch.bfloat16)
    memory = torch.randn(batch, source, width, device=DEVICE, dtype=torch.bfloat16)
    padding = torch.zeros(batch, source, dtype=torch.bool, device=DEVICE)
    padding[-1, source // 2:] = True

    def attend(query, memory, padding):
        with torch.no_grad():
            return attention(query, memory, memory, key_padding_mask=padding)

    (out, weights), graph = _compiled(attend, query, memory, padding, observe=observe)
    want_out, want_weights = attend(query, memory, padding)
    torch.testing.assert_close(out, want_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(weights, want_weights, atol=2e-2, rtol=2e-2)
    scores = batch * heads * length * source * 2
    # The probabilities go where the scores die: never both alive, as they were while the averaging
    # kernel recomputed the softmax from the scores.
    assert graph.planned_peak_bytes < 2 * scores, graph.wrapper_source
