"""Runs one (model, mode) case: eager, compiled and a float64 reference of the same weights and
inputs, judged by smelt.tools.accuracy. Returns what failed, never raises for a model's failure.

- infer_fp32 / infer_bf16: the model in .eval() and that dtype; the reference is the same
  (bf16-rounded) weights in float64.
- train: one step (forward, loss, backward, SGD with momentum) from identical weights; compares the
  loss, every gradient, every parameter and buffer after the step. SGD, as PyTorch's own benchmark
  harness uses: Adam's first step is lr * g / |g|, so a gradient that is zero up to rounding moves
  its parameter by +-lr on a coin flip of summation order, which no accuracy rule can judge. fp32 on the CPU, bf16 autocast on CUDA
  (the reference runs without autocast). The optimizer step is compiled too.
- dynamic: decoders compiled with dynamic=True, run over several sequence lengths.
- decode: a decoder's one-token step with a KV cache filled by an eager prefill; compares the
  logits and the cache after the step.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import time
import traceback

import torch
import torch._dynamo.testing

from ..accuracy import compare, cudnn_without_tf32, to_float64
from .cache_tensors import cache_kwargs, cache_of, outputs_with_plain_cache
from .modes import DYNAMIC_SEQS, applies
from .spec import ModelSpec, Sample, autocast_for, build_model, library_missing, seeded
from .timing import measure_case, progress

LR = 1e-3


@dataclasses.dataclass
class CaseResult:
    model: str
    mode: str
    size: str
    device: str
    status: str  # "pass", "fail" (accuracy), "error" (an exception), "skip"
    failures: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0  # wall clock of the check
    cpu_seconds: float = 0.0  # this process's CPU time (all threads): what the check costs on an idle machine
    timings: dict | None = None

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def message(self, limit: int = 6) -> str:
        lines = self.failures[:limit] + ([f"... and {len(self.failures) - limit} more"]
                                          if len(self.failures) > limit else [])
        return "\n".join(lines)


# torch.compile's mode for the compiled side (run_case sets it). Under "reduce-overhead" each case
# makes CALLS_WITH_GRAPHS calls and compares the last: the first warms up, the second records.
_compile_mode: str | None = None
CALLS_WITH_GRAPHS = 3


def _compile(fn, backend, **kw):
    if _compile_mode is not None:
        kw["mode"] = _compile_mode
    return torch.compile(fn, backend=backend, **kw)


def _calls() -> int:
    return CALLS_WITH_GRAPHS if _compile_mode in ("reduce-overhead", "max-autotune") else 1


# ---------------------------------------------------------------- inference
def _infer(spec, size, device, backend, seed, dtype, notes):
    model = build_model(spec, size, seed).to(device=device, dtype=dtype).eval()
    sample = spec.sample(size, generator=seeded(seed)).to(device, float_dtype=dtype)
    reference_model = to_float64(model)
    with torch.no_grad():
        expected = model(**sample.kwargs)
        reference = reference_model(**sample.to(device, float_dtype=torch.float64).kwargs)
        compiled = _compile(model, backend)
        for _ in range(_calls()):
            actual = compiled(**sample.kwargs)
    return compare(actual, expected, reference)


# ---------------------------------------------------------------- training
def _train_step(model, sample, loss_fn, step_fn, autocast):
    with autocast:
        loss = loss_fn(sample)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    step_fn()
    state = {f"param[{name}]": p.detach().clone() for name, p in model.named_parameters()}
    state.update({f"buffer[{name}]": b.detach().clone() for name, b in model.named_buffers() if b.is_floating_point()})
    return {"loss": loss.detach(), "grads": grads, "after_step": state}


def _train(spec, size, device, backend, seed, notes):
    base = build_model(spec, size, seed).to(device).train()
    sample = spec.sample(size, generator=seeded(seed)).to(device)
    eager_m, compiled_m, reference_m = base, copy.deepcopy(base), to_float64(base)

    def run(model, sample, compiled, autocast):
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=1e-2, foreach=True)
        loss_fn = functools.partial(spec.loss, model)
        step_fn = opt.step
        if compiled:
            loss_fn = _compile(loss_fn, backend)
            step_fn = _compile(opt.step, backend)
        for _ in range(_calls()):  # every side takes the same steps
            opt.zero_grad(set_to_none=True)
            result = _train_step(model, sample, loss_fn, step_fn, autocast)
        return result

    expected = run(eager_m, sample, False, autocast_for(device))
    reference = run(reference_m, sample.to(device, float_dtype=torch.float64), False, torch.autocast("cpu", enabled=False))
    actual = run(compiled_m, sample, True, autocast_for(device))
    missing = sorted(set(expected["grads"]) - set(actual["grads"]))
    if missing:
        return [f"grads: compiled has no gradient for {missing[:5]}"]
    low_precision = torch.bfloat16 if torch.device(device).type == "cuda" else None  # bfloat16 autocast
    return compare(actual, expected, reference, path="train", low_precision=low_precision)


# ---------------------------------------------------------------- dynamic shapes
def _dynamic(spec, size, device, backend, seed, notes):
    model = build_model(spec, size, seed).to(device).eval()
    reference_model = to_float64(model)
    counted = backend
    if _compile_mode is not None:  # the counter calls its backend without torch.compile's mode
        counted = functools.partial(torch._dynamo.lookup_backend(backend), mode=_compile_mode)
    counter = torch._dynamo.testing.CompileCounterWithBackend(counted)
    compiled = torch.compile(model, backend=counter, dynamic=True)
    failures = []
    with torch.no_grad():
        for seq in DYNAMIC_SEQS[size]:
            sample = spec.sample(size, seq_len=seq, generator=seeded(seed + seq)).to(device)
            expected = model(**sample.kwargs)
            reference = reference_model(**sample.to(device, float_dtype=torch.float64).kwargs)
            for _ in range(_calls()):
                actual = compiled(**sample.kwargs)
            failures += compare(actual, expected, reference, path=f"seq {seq}")
    if counter.frame_count > 1:
        notes.append(f"{counter.frame_count} graphs compiled over {len(DYNAMIC_SEQS[size])} sequence lengths")
    return failures


# ---------------------------------------------------------------- one-token decode with a KV cache
def _decode(spec, size, device, backend, seed, notes):
    model = build_model(spec, size, seed).to(device).eval()
    reference_model = to_float64(model)
    prompt = spec.sample(size, generator=seeded(seed)).to(device)
    prefill = dict(prompt.kwargs, use_cache=True)
    with torch.no_grad():
        out = model(**prefill)
        next_ids = out.logits[:, -1:].argmax(-1)
        cache = cache_of(out)
        reference_cache = cache_of(reference_model(**Sample(prefill).to(device, float_dtype=torch.float64).kwargs))

        def step(m, cache):
            return outputs_with_plain_cache(m(input_ids=next_ids, **cache_kwargs(model, cache)))

        expected = step(model, copy.deepcopy(cache))
        reference = step(reference_model, reference_cache)
        compiled = _compile(model, backend)
        for _ in range(_calls()):
            actual = step(compiled, copy.deepcopy(cache))
    return compare(actual, expected, reference, path="decode")


RUNNERS = {
    "infer_fp32": functools.partial(_infer, dtype=torch.float32),
    "infer_bf16": functools.partial(_infer, dtype=torch.bfloat16),
    "train": _train,
    "dynamic": _dynamic,
    "decode": _decode,
}


def run_case(spec: ModelSpec, mode: str, size: str = "tiny", device: str = "cpu", backend: str = "smelt",
             seed: int = 0, timings: bool = False, timing_kw: dict | None = None,
             compile_mode: str | None = None) -> CaseResult:
    global _compile_mode
    _compile_mode = compile_mode
    try:
        return _run_case(spec, mode, size, device, backend, seed, timings, timing_kw)
    finally:
        _compile_mode = None


@contextlib.contextmanager
def _without_tf32():
    """The accuracy check's float32 convolutions and products in full float32, eager's and compiled.

    With TF32 allowed (cuDNN's default) cuDNN takes TF32 algorithms for channels-last convolutions
    where it did not for eager's NCHW ones: tiny DenseNet on the H200 read an rmse of 2.3e-4 against
    eager's 3e-7, Inductor's the same. That judges cuDNN's choice, not the compiler.
    """
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with cudnn_without_tf32():
            yield
    finally:
        torch.set_float32_matmul_precision(precision)


def _run_case(spec, mode, size, device, backend, seed, timings, timing_kw) -> CaseResult:
    result = CaseResult(spec.name, mode, size, device, "skip")
    if not applies(spec, mode):
        result.notes.append(f"{mode} applies to decoders only")
        return result
    why = library_missing(spec)
    if why:
        result.notes.append(why)
        return result
    torch._dynamo.reset()
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        with _without_tf32():
            result.failures = RUNNERS[mode](spec, size, device, backend, seed, notes=result.notes)
        result.status = "fail" if result.failures else "pass"
    except Exception as exc:  # a model's failure is a result, not the end of the run
        result.status = "error"
        frames = traceback.extract_tb(exc.__traceback__)
        where = next((f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in reversed(frames)), "?")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        result.failures = [f"{type(exc).__name__}: {first[:500]} (raised at {where})"]
        result.notes.append("".join(traceback.format_exception(exc))[-4000:])
    result.seconds = time.perf_counter() - start
    result.cpu_seconds = time.process_time() - cpu_start
    progress(f"{spec.name} {mode}: accuracy check {result.status} in {result.seconds:.1f} s")
    if timings and result.status == "pass":
        try:
            result.timings = measure_case(spec, mode, size, device, seed=seed, **(timing_kw or {}))
        except Exception as exc:
            result.notes.append(f"timing failed: {type(exc).__name__}: {str(exc)[:300]}")
    torch._dynamo.reset()
    return result
