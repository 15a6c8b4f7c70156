"""The accuracy rule smelt is judged by: a compiled result may be at most a few times further from a
float64 run of the same program than eager's own result is.

A fixed tolerance fails correct programs whose eager result is itself far from exact (long bf16
reductions, a softmax of large logits) and passes wrong ones whose values are small (gradients of
1e-6). Measuring both eager and the compiled result against float64 asks the right question: did
compiling lose more precision than running the ops one by one did?

- floating tensors: pass when close to eager at the dtype's tolerance, or when
  rmse(compiled - fp64) <= multiplier * rmse(eager - fp64) + floor, the multiplier 2 in float32/64
  and 3 in half precisions, the floor a small share of the reference's rms. Non-finite values must
  sit where eager's are, and be the same.
- the floor is never below one rounding of the precision the program computes in: in bfloat16 its
  unit roundoff, 2**-8 of the reference's rms. A result rounded once from the exact value is the
  best any order of bfloat16 operations can promise, and a few elements computed alike (RMSNorm
  over rows of one element) can all round eager's lucky way at once: eager exact, the compiled
  result one ulp off, in every element. float16's floor, 1e-3, is two of its unit roundoffs.
  On top of it, the output's own rounding to its dtype (half an ulp at the reference's values): an
  intermediate one ulp off is rounded again when stored, so a bfloat16 result can be one of its
  ulps off float64 where eager's luck lands on it (fuzz seed 4341: x * rsqrt(mean(x * x)) * w over
  one bfloat16 element, eager's CPU rsqrt rounding its sqrt first).
- few elements say little about the rounding noise (eager may round them all the lucky way), so, as
  in the harness (torch._dynamo.utils.same), a result of under 1,000 elements gets a multiplier of 3
  and one of at most 10 elements (with its small-tensor option) 10: one ulp of a summation order,
  amplified by a normalization, is then not a failure.
- integer and bool tensors, and Python scalars: equal to eager's.
- shapes, dtypes and nesting (tuples, lists, dicts, transformers' ModelOutput) must match eager's.
"""
from __future__ import annotations

import dataclasses
import math

import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class Tolerance:
    multiplier: float  # how many times eager's error against float64 compiled may have
    close: float  # atol = rtol under which compiled counts as equal to eager outright
    floor: float  # share of the reference's rms always allowed (eager may be exact by luck)


def tolerance_for(dtype: torch.dtype) -> Tolerance:
    if dtype == torch.bfloat16:
        return Tolerance(multiplier=3.0, close=1e-3, floor=2.0 ** -8)
    if dtype == torch.float16:
        return Tolerance(multiplier=3.0, close=1e-3, floor=1e-3)
    if dtype == torch.float64:
        return Tolerance(multiplier=2.0, close=1e-10, floor=1e-12)
    return Tolerance(multiplier=2.0, close=1e-6, floor=1e-6)


def cudnn_without_tf32():
    """A context with cuDNN's TF32 off (its convolutions in full float32), other cuDNN flags as they are.
    Through flags(), not by setting the attribute: once torch.testing._internal is imported, the
    global flags are frozen and setting one raises."""
    cudnn = torch.backends.cudnn
    return cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic,
                       allow_tf32=False)


def to_float64(obj):
    """A copy of nested tensors (and modules) in float64, for the reference run. Integer tensors stay."""
    if isinstance(obj, torch.nn.Module):
        import copy
        return copy.deepcopy(obj).to(torch.float64)
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            return obj.detach().to(torch.float64).requires_grad_(obj.requires_grad)
        return obj
    return _map_nested(obj, to_float64)


def _map_nested(obj, fn):
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(fn(x) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(fn(x) for x in obj)
    if isinstance(obj, dict):
        return {k: fn(v) for k, v in obj.items()}
    return obj


def _rms(t: torch.Tensor) -> float:
    return t.double().pow(2).mean().sqrt().item() if t.numel() else 0.0


def _output_rounding(reference: torch.Tensor, dtype: torch.dtype) -> float:
    """The rms of half an ulp of `dtype` at the reference's values."""
    if not dtype.is_floating_point or dtype == torch.float64:
        return 0.0
    info = torch.finfo(dtype)
    magnitude = reference.abs().clamp_min(info.tiny)
    return _rms(info.eps / 2 * torch.exp2(torch.floor(torch.log2(magnitude))))


def _multiplier(tol: Tolerance, numel: int) -> float:
    if numel <= 10:
        return max(tol.multiplier, 10.0)
    if numel < 1000:
        return max(tol.multiplier, 3.0)
    return tol.multiplier


def _compare_tensor(actual: torch.Tensor, expected: torch.Tensor, reference, path: str,
                    low_precision: torch.dtype | None = None) -> str | None:
    if not isinstance(actual, torch.Tensor):
        return f"{path}: expected a tensor, got {type(actual).__name__}"
    if actual.shape != expected.shape:
        return f"{path}: shape {tuple(actual.shape)}, eager {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"{path}: dtype {actual.dtype}, eager {expected.dtype}"
    if actual.device != expected.device:
        return f"{path}: device {actual.device}, eager {expected.device}"
    if actual.numel() == 0:
        return None
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if not (e.is_floating_point() or e.is_complex()):
        if torch.equal(a, e):
            return None
        wrong = (a != e).sum().item()
        return f"{path}: {wrong} of {e.numel()} values differ from eager's ({e.dtype})"
    tol = tolerance_for(low_precision if low_precision in LOW_PRECISION else e.dtype)
    a64, e64 = a.to(torch.float64), e.to(torch.float64)
    finite = torch.isfinite(e64)
    if not torch.equal(finite, torch.isfinite(a64)) or not torch.equal(
            torch.where(finite, 0.0, a64).nan_to_num(nan=7.0), torch.where(finite, 0.0, e64).nan_to_num(nan=7.0)):
        return f"{path}: non-finite values differ from eager's (eager {(~finite).sum().item()} non-finite)"
    a64, e64 = a64[finite], e64[finite]
    if torch.allclose(a64, e64, atol=tol.close, rtol=tol.close):
        return None
    if reference is None:
        return f"{path}: max abs diff {(a64 - e64).abs().max().item():.3g} from eager, and no float64 reference"
    r64 = reference.detach().cpu().to(torch.float64)[finite]
    err, eager_err = _rms(a64 - r64), _rms(e64 - r64)
    allowed = (_multiplier(tol, r64.numel()) * eager_err + tol.floor * max(_rms(r64), 1e-30)
               + _output_rounding(r64, e.dtype))
    if err <= allowed or math.isclose(err, allowed):
        return None
    return (f"{path}: rmse against float64 {err:.3g} > {allowed:.3g} allowed (eager's {eager_err:.3g}; "
            f"max abs diff from eager {(a64 - e64).abs().max().item():.3g})")


def compare(actual, expected, reference=None, path: str = "output",
            low_precision: torch.dtype | None = None) -> list[str]:
    """Every way `actual` (compiled) fails the rule against `expected` (eager), given `reference`
    (the same program in float64; None: only closeness to eager counts). Empty when it passes.
    `low_precision`: the half precision the program computed in whatever its results' dtype
    (autocast returns a float32 loss computed from bfloat16 products); its tolerance applies."""
    if isinstance(expected, torch.Tensor):
        msg = _compare_tensor(actual, expected, reference, path, low_precision)
        return [msg] if msg else []
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or list(actual.keys()) != list(expected.keys()):
            return [f"{path}: keys {list(actual.keys()) if isinstance(actual, dict) else type(actual).__name__}, "
                    f"eager {list(expected.keys())}"]
        return [m for k in expected for m in compare(
            actual[k], expected[k], None if reference is None else reference[k], f"{path}[{k!r}]", low_precision)]
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return [f"{path}: {type(actual).__name__} of {len(actual) if hasattr(actual, '__len__') else '?'}, "
                    f"eager {type(expected).__name__} of {len(expected)}"]
        return [m for i in range(len(expected)) for m in compare(
            actual[i], expected[i], None if reference is None else reference[i], f"{path}[{i}]", low_precision)]
    if isinstance(expected, float) and isinstance(actual, float):
        if math.isclose(actual, expected, rel_tol=1e-6, abs_tol=1e-9) or (math.isnan(actual) and math.isnan(expected)):
            return []
    elif actual == expected:
        return []
    return [f"{path}: {actual!r}, eager {expected!r}"]


def assert_accurate(actual, expected, reference=None, what: str = "output") -> None:
    failures = compare(actual, expected, reference, what)
    if failures:
        raise AssertionError("smelt's result fails the accuracy rule:\n  " + "\n  ".join(failures))
