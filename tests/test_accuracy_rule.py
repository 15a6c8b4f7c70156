"""The accuracy rule (smelt/tools/accuracy.py) that the model suite and the fuzzer judge by."""
import pytest
import torch

from smelt.tools.accuracy import compare, to_float64

pytestmark = pytest.mark.cpu_backend_independent


def _case(dtype, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(256, 256)
    ref = (x.double() @ x.double()).sum(-1)
    eager = (x.to(dtype) @ x.to(dtype)).sum(-1)
    return ref, eager


def test_a_result_as_close_to_float64_as_eager_passes():
    ref, eager = _case(torch.bfloat16)
    other = eager.clone()
    other[::7] = ref[::7].to(torch.bfloat16)  # some values exact: closer to float64 than eager
    assert compare(other, eager, ref) == []


def test_a_wrong_result_fails_even_when_small():
    ref = torch.randn(100, dtype=torch.float64) * 1e-6
    eager = ref.float()
    assert compare(eager * 1.5, eager, ref)
    assert compare(eager, eager, ref) == []


def test_nonfinite_positions_and_integers_and_structure_must_match():
    e = torch.tensor([1.0, float("inf"), float("nan")])
    assert compare(torch.tensor([1.0, float("-inf"), float("nan")]), e, e.double())
    assert compare(torch.tensor([1.0, float("inf"), 2.0]), e, e.double())
    assert compare(e.clone(), e, e.double()) == []
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 3]))
    assert compare({"a": e}, {"b": e})
    assert compare(e.half(), e, e.double())


def test_to_float64_keeps_integers_and_grad():
    x = torch.randn(3, requires_grad=True)
    y, i = to_float64((x, torch.arange(3)))
    assert y.dtype == torch.float64 and y.requires_grad and i.dtype == torch.int64


def test_few_elements_allow_more_rounding_noise_but_not_a_wrong_value():
    # three softmin values normalized by group_norm (the H100 fuzzer's case): eager rounded luckily,
    # a one-ulp different sum order amplified by rstd ~ 300 is ten times eager's error
    ref = torch.tensor([-1.1, 0.3, 0.8], dtype=torch.float64)
    eager = (ref + torch.tensor([2e-7, -1e-7, 1e-7], dtype=torch.float64)).float()
    noisy = (ref + torch.tensor([2.5e-6, -2e-6, 1e-6], dtype=torch.float64)).float()
    assert compare(noisy, eager, ref) == []
    assert compare((ref * 1.01).float(), eager, ref)  # 1% off: wrong, however few the elements
    many_ref = ref.repeat(400)  # the same error over 1,200 elements: 2x eager's applies again
    assert compare(noisy.repeat(400), eager.repeat(400), many_ref)


def test_one_rounding_of_the_computing_precision_is_always_allowed():
    # RMSNorm over bfloat16 rows of one element (the CPU fuzzer's case): x * rsqrt(x * x) is 1 in
    # every element; eager's double rounding lands on exactly 1.0 everywhere, a once-rounded
    # rsqrt gives 0.99609375 (one bfloat16 ulp below 1) everywhere. The float32 weight makes a
    # float32 result computed in bfloat16.
    w = torch.linspace(0.3, 0.9, 18)
    ref, eager = w.double(), w.clone()
    one_ulp, two_ulps = w * 0.99609375, w * 0.9921875
    assert compare(one_ulp, eager, ref, low_precision=torch.bfloat16) == []
    assert compare(two_ulps, eager, ref, low_precision=torch.bfloat16)
    assert compare(one_ulp, eager, ref)  # a float32 program is held to float32's rounding
    assert compare(one_ulp, eager, ref, low_precision=torch.float16)  # eight float16 ulps


def test_the_outputs_own_rounding_comes_on_top_of_the_floor():
    # x * rsqrt(mean(x * x) + eps) * w over one bfloat16 element (fuzz seed 4341): eager's CPU rsqrt
    # rounds its sqrt to bfloat16 first and lands on 1.0; rounded once, rsqrt gives one ulp below,
    # and the product with w rounds again when stored: one bfloat16 ulp off float64, not wrong.
    ref = torch.tensor([[-0.77729]], dtype=torch.float64)
    eager = torch.tensor([[-0.77734375]], dtype=torch.bfloat16)
    assert compare(torch.tensor([[-0.7734375]], dtype=torch.bfloat16), eager, ref) == []
    assert compare(torch.tensor([[-0.76953125]], dtype=torch.bfloat16), eager, ref)  # two ulps off
