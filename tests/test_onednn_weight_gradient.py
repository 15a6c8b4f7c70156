"""oneDNN's bfloat16 weight gradient on the CPU is wrong on some strided shapes (never-written taps:
NaN, 1e38; CPU fuzz seed 4302): smelt computes such a weight gradient from float32 copies
(lowering/onednn_weight_gradient.py). Each case is a shape oneDNN got wrong in
benchmarks/probes/onednn_channels_last_weight_gradient.py, with freed memory filled with NaN first,
so a never-written value shows."""
import pytest
import torch
import torch.nn.functional as F

import smelt.config

CASES = [  # input size, weight size, stride, padding, groups, input layout
    ((1, 8, 2, 1), (8, 1, 4, 3), 2, 2, 8, torch.contiguous_format),  # the fuzzer's program (depthwise)
    ((1, 8, 2, 1), (8, 1, 2, 2), 2, 1, 8, torch.channels_last),
    ((2, 16, 6, 1), (16, 16, 4, 5), 2, 2, 1, torch.contiguous_format),  # dense, wrong in NCHW too
    ((2, 4, 2, 1), (4, 4, 3, 3), 2, 1, 1, torch.channels_last),
]


def _poison(*numels):
    blocks = [torch.full((n,), float("nan"), dtype=torch.bfloat16) for n in numels]
    del blocks


@pytest.mark.parametrize("depthwise_backward", ["auto", "on"])
@pytest.mark.parametrize("x_size, w_size, stride, padding, groups, layout", CASES)
def test_strided_bfloat16_weight_gradients_are_right(device, compile_fn, x_size, w_size, stride, padding, groups,
                                                     layout, depthwise_backward):
    if device != "cpu":
        pytest.skip("oneDNN's bug: the CPU only")
    torch.manual_seed(0)
    x = torch.randn(x_size).to(torch.bfloat16).contiguous(memory_format=layout)
    weight = torch.randn(w_size).to(torch.bfloat16).requires_grad_()
    exact_weight = weight.detach().double().requires_grad_()
    F.conv2d(x.double(), exact_weight, None, stride, padding, 1, groups).sum().backward()

    def fn(x, w):
        return F.conv2d(x, w, None, stride, padding, 1, groups)
    with smelt.config.override(depthwise_kernels=depthwise_backward):
        compiled = compile_fn(fn)
        for _ in range(3):  # each call's gradient into memory freed full of NaN
            weight.grad = None
            _poison(weight.numel(), x.numel(), 4096)
            compiled(x, weight).sum().backward()
            got = weight.grad.double()
            assert got.isfinite().all(), got
            torch.testing.assert_close(got, exact_weight.grad, atol=0.05, rtol=0.02)
