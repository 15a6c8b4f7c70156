"""Triton's interpreter converts bfloat16 and float32 as the GPU does (smelt/runtime/interpreter_compat.py):
its own converter flushed bfloat16 subnormals to zero, and truncated float32 to bfloat16 where the GPU rounds
to nearest even."""
import numpy as np
import pytest
import torch

from smelt.runtime.interpreter_compat import bfloat16_bits_to_float32, float32_to_bfloat16_bits


def test_every_bfloat16_converts_to_float32_exactly():
    bits = np.arange(1 << 16, dtype=np.uint16)
    expected = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16).float().numpy()
    actual = bfloat16_bits_to_float32(bits)
    same = (actual.view(np.uint32) == expected.view(np.uint32)) | (np.isnan(actual) & np.isnan(expected))
    assert same.all()


def test_float32_rounds_to_bfloat16_as_torch_does():
    values = np.concatenate([
        np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * np.float32(1e3),
        np.array([0.0, -0.0, np.inf, -np.inf, 9.2e-41, -9.2e-41, 1e-45, 3.4e38, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8],
                 dtype=np.float32),
        np.random.default_rng(1).integers(0, 1 << 32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
    ])
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    actual = float32_to_bfloat16_bits(values)
    nan = np.isnan(values)
    assert (actual[~nan] == expected[~nan]).all()
    assert np.isnan(bfloat16_bits_to_float32(actual[nan])).all()


@pytest.mark.skipif(__import__("os").environ.get("SMELT_CPU_BACKEND") != "triton",
                    reason="runs CPU kernels in Triton's interpreter")
def test_bfloat16_subnormals_reach_an_interpreted_kernel(compile_fn):
    x = torch.tensor([9.18355e-41, -9.18355e-41, 4.0, 1e-30, 1e-39], dtype=torch.bfloat16)
    for fn in (torch.sqrt, lambda x: x * 2, lambda x: torch.sqrt(x.float())):
        torch._dynamo.reset()
        torch.testing.assert_close(compile_fn(fn)(x), fn(x), equal_nan=True, atol=0, rtol=0)
