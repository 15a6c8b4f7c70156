"""Runs a program eagerly, in float64 and through smelt, and judges smelt's result by the accuracy rule.

Eager raising means the program is invalid (skip). smelt raising where eager ran is a crash. Outputs,
every input's gradient (backward through random cotangents) and inputs the program mutates are
compared."""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import threading
import time
import traceback
import warnings

import torch
import torch._dynamo

from ..accuracy import compare, to_float64
from .inputs import make_input
from .journal import STATUSES
from .program import Program

COTANGENT_SEED = 9001
# Each float input scaled by these in turn (a uniform scale keeps exact ties and zeros): a program
# whose float64 answer then fails the rule against eager is ill-conditioned at its inputs (the sign
# of a sum that is 0 up to rounding, an argmin among values tied up to rounding): eager's answer
# there is its own rounding noise, and no result can be judged by it.
RESCALINGS = (1 + 2 ** -30, 1 - 2 ** -30, 1 + 2 ** -28)


@dataclasses.dataclass
class Result:
    status: str  # pass | fail (wrong values) | crash (smelt raised) | timeout | skip (eager raised)
    #              | unsupported (torch.compile raises or is wrong without smelt too: aot_eager)
    #              | ill-conditioned (the float64 answer moves past the rule under a tiny rescaling)
    #              | refused (right values, but Halide's compiler refused a kernel smelt wrote for it)
    messages: list = dataclasses.field(default_factory=list)
    names: list = dataclasses.field(default_factory=list)  # program values/inputs each message is about
    seconds: float = 0.0

    def __post_init__(self):
        if self.status not in STATUSES:  # the journal and the summary count each status by name
            raise ValueError(f"fuzz: unknown status {self.status!r}: add it to journal.STATUSES")

    def signature(self) -> str:
        """What 'fails the same way' means to the shrinker: the status, and for a crash its exception
        type and first message line with numbers and value names blotted out."""
        if self.status not in ("crash", "refused") or not self.messages:
            return self.status
        lines = [line for line in self.messages[0].splitlines() if not line.startswith("Set TORCHDYNAMO")]
        text = " ".join(lines[:2]) if lines[0].endswith("raised:") else lines[0]  # Dynamo's wrapper: the cause
        # A kernel's error keeps its cause (a compile error leads with the line it failed at), so two
        # kernels failing for two reasons are two findings; names, paths and its ops are blotted out.
        text = re.sub(r"from ATen ops:[^;]*;?|source: \S+|/\S+|\b\w*fused\w*|\btriton_\w+|\([\w-]*x86[\w-]*\)",
                      "", text)
        return self.status + ": " + re.sub(r"\b[xv]\d+\b|\d+", "#", text)[:240]


class _HalideRefusals(logging.Handler):
    """smelt's warnings, while a program compiles, that Halide's compiler refused a kernel smelt wrote
    (the kernel then runs in Triton, right but slow on a CPU): a bug in smelt's Halide code."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        message = record.getMessage()
        if "runs in Triton instead of Halide" in message:
            self.messages.append(message.split("; source:")[0])

    def __enter__(self):
        logging.getLogger("smelt").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("smelt").removeHandler(self)


class Timeout(Exception):
    pass


class _deadline:
    """SIGALRM after `seconds` (main thread only; elsewhere no limit)."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.armed = seconds and threading.current_thread() is threading.main_thread()

    def __enter__(self):
        if self.armed:
            def on_alarm(signum, frame):
                raise Timeout(f"no result after {self.seconds} s")
            self.previous = signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)


def exact_clone(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes, strides and offset (clone() would make an expanded input dense)."""
    c = torch.empty((), dtype=t.dtype, device=t.device)
    c.set_(t.detach().untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())
    return c.requires_grad_(t.requires_grad)


def _cotangents(outs, dtypes):
    gen = torch.Generator().manual_seed(COTANGENT_SEED)
    return [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(d).to(o.dtype).to(o.device)
            for o, d in zip(outs, dtypes)]


def _needs_grad(o):
    return isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()


def run_once(fn, inputs, backward, cot_dtypes=None):
    """fn on `inputs` (used as they are: mutated in place): (outputs, gradients, inputs after the call,
    the dtypes its cotangents were drawn in)."""
    outs = fn(*inputs)
    sharing = shared_memory(outs, inputs)
    grads, dtypes = [], []
    if backward:
        diff = [o for o in outs if _needs_grad(o)]
        dtypes = cot_dtypes or [o.dtype for o in diff]
        if diff:
            torch.autograd.backward(diff, _cotangents(diff, dtypes))
        grads = [i.grad for i in inputs if i.requires_grad]
    after = [None if i.requires_grad else i for i in inputs]
    return list(outs), grads, after, dtypes, sharing


def shared_memory(outs, inputs) -> frozenset:
    """Which outputs lie in an input's memory or an earlier output's: pairs (output k, ("input" |
    "output", j)). A compiled program must share exactly where eager does: an output eager makes anew
    that is an input's memory here shows the caller's writes to either in the other (fuzz seed 2802)."""
    def storage(t):
        if not isinstance(t, torch.Tensor) or t.untyped_storage().nbytes() == 0:
            return None
        return t.untyped_storage().data_ptr()
    found, earlier = set(), []
    ins = [storage(i) for i in inputs]
    for k, out in enumerate(outs):
        pointer = storage(out)
        if pointer is None:
            continue
        found |= {(k, ("input", j)) for j, p in enumerate(ins) if p == pointer}
        found |= {(k, ("output", j)) for j, p in earlier if p == pointer}
        earlier.append((k, pointer))
    return frozenset(found)


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return "\n".join(lines[:6])[:1500]


# Set by the CLI's --cache-hits: smelt's result is its second compile's, which the graph cache
# serves (at the Dynamo level, AOTAutograd skipped, where the graph qualifies).
CACHE_HITS = "FUZZ_CACHE_HITS"
# Set by the CLI's --precompile: the compiled program is saved by torch's precompile (aot_compile),
# loaded again (smelt/precompile.py) and the loaded one judged.
PRECOMPILE = "FUZZ_PRECOMPILE"
# Set (by the CLI's --layouts): every matrix product is padded, however small (the size thresholds
# keep the fuzzer's products from it otherwise).
EVERY_PRODUCT_PADDED = "FUZZ_EVERY_PRODUCT_PADDED"


def _compiled_run(fn, make_inputs, backward, cot_dtypes, backend):
    if os.environ.get(EVERY_PRODUCT_PADDED):
        from smelt.lowering import matmul_padding
        matmul_padding.MIN_MACS = matmul_padding.MIN_MATRIX_MACS = 0
    torch._dynamo.reset()
    try:
        if os.environ.get(PRECOMPILE):
            if backend != "smelt":  # without smelt: AOTAutograd under a precompile, then one torch can save
                _aot_eager_under_precompile(fn, make_inputs())
            loaded = _precompiled(fn, make_inputs(), "smelt" if backend == "smelt" else "eager")
            return run_once(loaded, make_inputs(), backward, cot_dtypes)
        if backend == "smelt" and os.environ.get(CACHE_HITS):
            run_once(torch.compile(fn, backend=backend, fullgraph=True), make_inputs(), backward, cot_dtypes)
            torch._dynamo.reset()
        return run_once(torch.compile(fn, backend=backend, fullgraph=True), make_inputs(), backward, cot_dtypes)
    finally:
        torch._dynamo.reset()


def _precompiled(fn, inputs, backend: str):
    import tempfile
    compiled = torch.compile(fn, backend=backend, fullgraph=True).aot_compile((tuple(inputs), {}))
    with tempfile.TemporaryDirectory(prefix="smelt-fuzz-precompile-") as folder:
        path = os.path.join(folder, "program.bin")
        compiled.save_compiled_function(path)
        torch._dynamo.reset()
        with open(path, "rb") as f:
            return torch.compiler.load_compiled_function(f)


def _aot_eager_under_precompile(fn, inputs) -> None:
    """Raises what AOTAutograd raises under torch's precompile (a restart Dynamo catches only outside
    one, ...); aot_eager's result is one the precompile cannot save, which is not asked of it here."""
    try:
        torch.compile(fn, backend="aot_eager", fullgraph=True).aot_compile((tuple(inputs), {}))
    except RuntimeError as e:
        if "does not implement SerializableCallable" not in str(e):
            raise
    finally:
        torch._dynamo.reset()


def judge(fn, make_inputs, backward: bool, names=None, timeout: float = 60.0, reference_fn=None,
          computes_in=None) -> Result:
    """make_inputs() gives fresh inputs each call. names: each input's and output's name in the program
    (for the messages). reference_fn: fn computing in float64 throughout (default fn, on float64 inputs).
    computes_in: the narrowest float dtype fn casts to; wider results are judged at its precision."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager's own (a var of one element, ...), once per program
        return _judge(fn, make_inputs, backward, names, timeout, reference_fn or fn, computes_in)


def _judge(fn, make_inputs, backward, names, timeout, reference_fn, computes_in) -> Result:
    start = time.perf_counter()
    inputs = make_inputs()
    n_out = None
    try:
        eager = run_once(fn, inputs, backward)
    except Exception as exc:  # an invalid program: not smelt's fault
        return Result("skip", [_short(exc)], seconds=time.perf_counter() - start)
    n_out = len(eager[0])
    in_names = (names or {}).get("inputs") or [f"input{k}" for k in range(len(inputs))]
    out_names = (names or {}).get("outputs") or [f"output{k}" for k in range(n_out)]
    try:
        reference = run_once(reference_fn, to_float64([exact_clone(i) for i in make_inputs()]), backward, eager[3])
    except Exception:
        reference = None
    try:
        with _deadline(timeout), _HalideRefusals() as refusals:
            actual = _compiled_run(fn, make_inputs, backward, eager[3], "smelt")
    except Timeout as exc:
        return Result("timeout", [str(exc)], seconds=time.perf_counter() - start)
    except Exception as exc:
        if "Timeout: no result after" in str(exc):  # the deadline struck inside a compile that wrapped it
            return Result("timeout", [f"no result after {timeout} s"], seconds=time.perf_counter() - start)
        if isinstance(exc, MemoryError):  # the process ran out (vm.max_map_count): aot_eager would too
            return Result("crash", [_short(exc)], seconds=time.perf_counter() - start)
        try:  # Dynamo or AOTAutograd raising without smelt: not smelt's bug
            _compiled_run(fn, make_inputs, backward, eager[3], "aot_eager")
        except Exception as without:
            return Result("unsupported", ["torch.compile raises without smelt too (aot_eager): " + _short(without)],
                          seconds=time.perf_counter() - start)
        return Result("crash", [_short(exc)], seconds=time.perf_counter() - start)
    grad_names = [n for n, i in zip(in_names, inputs) if i.requires_grad]
    labelled = ([(f"{n} (output)", n) for n in out_names] + [(f"{n}.grad", n) for n in grad_names]
                + [(f"{n} after the call", n) for n in in_names])

    def judged(run):
        found = []
        for (label, name), a, e, r in zip(labelled, run[0] + run[1] + run[2], eager[0] + eager[1] + eager[2],
                                          (reference[0] + reference[1] + reference[2]) if reference
                                          else [None] * len(labelled)):
            if e is None and a is None:
                continue
            low = None
            if (computes_in is not None and isinstance(e, torch.Tensor) and e.is_floating_point()
                    and e.dtype.itemsize > computes_in.itemsize):  # rounded to computes_in on the way
                if computes_in.itemsize == 2:
                    low = computes_in
                elif isinstance(a, torch.Tensor) and a.is_floating_point():
                    a, e = a.to(computes_in), e.to(computes_in)
            found += [(name, m) for m in compare(a, e, r, label, low_precision=low)]
        if len(run) > 4 and run[4] != eager[4]:  # reference runs (float64, the CPU) carry no sharing
            for k, (kind, j) in sorted(run[4] ^ eager[4]):
                other = in_names[j] if kind == "input" else out_names[j]
                where = "shares" if (k, (kind, j)) in run[4] else "does not share"
                found.append((out_names[k], f"{out_names[k]} (output) {where} memory with {kind} {other}, "
                                            f"unlike eager"))
        return found
    found = judged(actual)
    messages, where = [m for _, m in found], [n for n, _ in found]
    if found and reference is not None:
        moved = _rescaled_reference_fails(reference_fn, make_inputs, backward, eager, judged)
        if moved:
            return Result("ill-conditioned", [f"a float64 run on inputs scaled by {moved[0]!r} fails the rule too "
                                              f"({moved[1]}); smelt's: {messages[0]}"], seconds=time.perf_counter() - start)
        other = _cpu_eager_fails(fn, make_inputs, backward, eager, judged)
        if other:
            return Result("ill-conditioned", [f"eager on the CPU, another implementation of the same ops, fails the "
                                              f"rule too ({other}); smelt's: {messages[0]}"],
                          seconds=time.perf_counter() - start)
    if found:
        try:
            if judged(_compiled_run(fn, make_inputs, backward, eager[3], "aot_eager")):
                return Result("unsupported", ["torch.compile without smelt (aot_eager) fails the rule too: "
                                              + messages[0]], seconds=time.perf_counter() - start)
        except Exception:
            pass
    if not messages and refusals.messages:
        return Result("refused", refusals.messages, seconds=time.perf_counter() - start)
    status = "fail" if messages else "pass"
    return Result(status, messages, where, seconds=time.perf_counter() - start)


def _rescaled_reference_fails(reference_fn, make_inputs, backward, eager, judged) -> tuple | None:
    """(scale, first failure) for the first of RESCALINGS under which the float64 program, its
    results cast to eager's dtypes, fails the rule against eager; None when none does."""
    for scale in RESCALINGS:
        inputs = [(i.detach() * scale).requires_grad_(i.requires_grad)
                  if isinstance(i, torch.Tensor) and i.is_floating_point() else i
                  for i in to_float64([exact_clone(i) if isinstance(i, torch.Tensor) else i for i in make_inputs()])]
        try:
            run = run_once(reference_fn, inputs, backward, eager[3])
        except Exception:
            return None
        cast = tuple([a.to(e.dtype) if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor)
                      and a.is_floating_point() and e.is_floating_point() else a for a, e in zip(got, want)]
                     for got, want in zip(run[:3], eager[:3]))
        found = judged(cast + (run[3],))
        if found:
            return scale, found[0][1]
    return None


def _on_the_cpu(t):
    if not isinstance(t, torch.Tensor) or t.device.type == "cpu":
        return t
    c = torch.empty((), dtype=t.dtype)
    c.set_(t.detach().untyped_storage().cpu(), t.storage_offset(), t.size(), t.stride())
    return c.requires_grad_(t.requires_grad)


def _cpu_eager_fails(fn, make_inputs, backward, eager, judged) -> str | None:
    """For a GPU program: the first failure of eager's CPU run (its results moved to the GPU)
    against eager's GPU run, or None. A GPU kernel and a CPU kernel of one ATen op (group_norm's
    backward from its half-float saved statistics) may each round their own way where the answer
    hangs on those roundings; the rule's allowance, one sample of eager's error, cannot judge
    smelt there when the CPU's eager falls outside it too."""
    inputs = make_inputs()
    if not any(isinstance(i, torch.Tensor) and i.device.type != "cpu" for i in inputs):
        return None
    device = next(i.device for i in inputs if isinstance(i, torch.Tensor) and i.device.type != "cpu")
    try:
        run = run_once(fn, [_on_the_cpu(i) for i in inputs], backward, eager[3])
    except Exception:
        return None
    moved = tuple([a.to(device) if isinstance(a, torch.Tensor) else a for a in part] for part in run[:3])
    found = judged(moved + (run[3],))
    return found[0][1] if found else None


def make_inputs(program: Program, device="cpu") -> list:
    return [make_input(i.shape, i.dtype, i.layout, i.grad, i.seed, i.kind, i.high, device) for i in program.inputs]


def judge_program(program: Program, device="cpu", timeout: float = 60.0) -> Result:
    """timeout: seconds per program (a batch of several gets as many times that)."""
    timeout = timeout * max(1, len(program.groups()))
    try:
        return judge(program.function(), lambda: make_inputs(program, device), program.backward,
                     {"inputs": [i.name for i in program.inputs], "outputs": list(program.outputs)}, timeout,
                     program.function(reference=True), program.narrowest_cast())
    except Exception as exc:  # the fuzzer's own harness failing: report it, do not stop the run
        return Result("crash", ["fuzzer harness: " + _short(exc) + "\n" + traceback.format_exc(limit=3)])


def check_fn(fn, inputs, backward=True, timeout: float = 60.0) -> list:
    """For a pasted repro: smelt's failures on fn(*inputs) by the accuracy rule (empty: it passes)."""
    floats = sorted({i.dtype for i in inputs if isinstance(i, torch.Tensor) and i.is_floating_point()},
                    key=lambda d: d.itemsize)  # as Program.narrowest_cast, from the inputs alone
    result = judge(fn, lambda: [exact_clone(i) for i in inputs], backward, timeout=timeout,
                   computes_in=floats[0] if floats else None)
    if result.status == "skip":
        return [f"eager raised (an invalid program): {result.messages[0]}"]
    return [f"{result.status}: {m}" for m in result.messages]


def judge_in_subprocess(program: Program, device="cpu", timeout: float = 60.0) -> Result:
    """judge_program in a fresh process: a program whose kernel kills the process is a 'segfault'."""
    import os
    import pickle
    import subprocess
    import sys
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as fh:
        pickle.dump(program, fh)
    code = ("import json, pickle, sys, smelt; from smelt.tools.fuzz.runner import judge_program; "
            f"r = judge_program(pickle.load(open({fh.name!r}, 'rb')), {device!r}, {timeout!r}); "
            "print(json.dumps([r.status, r.messages, r.names]))")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout * 3)
    except subprocess.TimeoutExpired:
        return Result("timeout", [f"no result after {timeout * 3} s"])
    finally:
        os.unlink(fh.name)
    if done.returncode < 0:
        return Result("segfault", [f"the process died by signal {-done.returncode}"])
    try:
        import json
        status, messages, names = json.loads(done.stdout.strip().splitlines()[-1])
        return Result(status, messages, names)
    except (ValueError, IndexError):
        return Result("crash", ["fuzzer harness: " + done.stderr[-1000:]])
