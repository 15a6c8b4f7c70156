"""Conformance against PyTorch's OpInfo database: every op's samples through smelt vs eager.

    python -m smelt.tools.opinfo --device cpu --dtype float32 [--ops add,sum] [--jobs 2]

Prints one line per op that does not pass (with the reason) and a summary: ops passed, failed
(wrong values), errored, skipped (random ops, no usable samples), and how many passing ops ran
fully lowered versus with an ATen fallback.

Values match when they are within OpInfo-like tolerances of eager. For float16/bfloat16 a result
that misses them still passes if it is at least as close as eager's to the op run in float64:
smelt rounds a fused chain once, eager after every op.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import signal
import sys
import time

from smelt.config import usable_cores

# Ops from these families are counted apart in the "fully lowered" share (issue 3's acceptance).
EXCLUDED_FAMILIES = ("linalg.", "fft.", "sparse", "special.", "to_sparse", "_segment_reduce")

OPS_PER_TASK = 4

DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "float64": "float64"}


@dataclasses.dataclass
class OpResult:
    name: str  # op name with its variant ("nn.functional.pad.reflect")
    status: str  # "pass" | "fail" | "error" | "skip"
    reason: str = ""
    fallbacks: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def family_excluded(self) -> bool:
        return self.name.startswith(EXCLUDED_FAMILIES)


def op_key(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _tolerance(dtype):
    import torch
    if dtype in (torch.bfloat16, torch.float16):
        return dict(rtol=1.6e-2, atol=1e-2)
    return dict(rtol=1e-4, atol=1e-4)


def _split_tensors(sample):
    """The sample as (tensor leaves, a function rebuilding the call from new tensors)."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten
    leaves, spec = tree_flatten(((sample.input, *sample.args), sample.kwargs))
    positions = [k for k, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[k] for k in positions]
    literal = _rebuild_as_literal(sample, len(tensors))
    if literal is not None:
        return tensors, literal

    def rebuild(tensors):
        filled = list(leaves)
        for k, t in zip(positions, tensors):
            filled[k] = t
        return tree_unflatten(filled, spec)
    return tensors, rebuild


def _rebuild_as_literal(sample, tensor_count: int):
    """The call rebuilt by one generated expression of tuples, lists and dicts, or None where the
    sample holds containers of other kinds. Dynamo traces a literal in milliseconds; pytree's
    unflatten took about 0.1 s of each sample's trace (the run's `--every 8 --first 3 --jobs 1`:
    65 -> 48 s)."""
    import torch
    constants, tensors = [], []

    def expression(value):
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return f"t[{len(tensors) - 1}]"
        if type(value) in (list, tuple):
            items = "".join(f"{expression(v)}, " for v in value)
            return f"[{items}]" if type(value) is list else f"({items})"
        if type(value) is dict:
            return "{" + "".join(f"{constant(k)}: {expression(v)}, " for k, v in value.items()) + "}"
        return constant(value)

    def constant(value):
        constants.append(value)
        return f"c[{len(constants) - 1}]"
    source = f"lambda t: (({expression(sample.input)}, {''.join(f'{expression(a)}, ' for a in sample.args)}), " \
             f"{expression(dict(sample.kwargs))})"
    if len(tensors) != tensor_count:  # tensors inside containers pytree knows and this does not
        return None
    make = eval(f"lambda c: {source}")  # noqa: S307 (source built above from positions, no sample text)
    return make(constants)


def _compare(actual, expected, tol) -> str | None:
    import torch
    from torch.utils._pytree import tree_flatten
    got, _ = tree_flatten(actual)
    want, _ = tree_flatten(expected)
    if len(got) != len(want):
        return f"{len(got)} outputs, eager gives {len(want)}"
    for k, (a, e) in enumerate(zip(got, want)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"output {k} is {type(a).__name__}, eager gives a tensor"
            try:
                torch.testing.assert_close(a, e, equal_nan=True, check_stride=False, **tol)
            except AssertionError as err:
                return f"output {k}: " + " ".join(str(err).split("\n")[:4])
        elif a != e and not (isinstance(e, float) and e != e and a != a):
            return f"output {k} is {a!r}, eager gives {e!r}"
    return None


def _closer_to_float64_than_eager(fn, tensors, actual, expected, problem: str) -> str | None:
    """For half-precision dtypes eager rounds after every op, while smelt computes a fused
    chain in float32 and rounds once, so the two can differ by an ulp or more where values
    cancel. Such a result passes when it is at least as close as eager's to the same op
    computed in float64; anything else keeps its original complaint."""
    import torch
    from torch.utils._pytree import tree_flatten
    wide = [t.double() if t.is_floating_point() else t.clone() for t in tensors]
    try:
        reference, _ = tree_flatten(fn(*wide))
    except Exception:
        return problem
    got, _ = tree_flatten(actual)
    want, _ = tree_flatten(expected)
    for a, e, r in zip(got, want, reference):
        if not (isinstance(e, torch.Tensor) and e.is_floating_point()):
            continue
        if not (isinstance(a, torch.Tensor) and isinstance(r, torch.Tensor) and a.shape == e.shape == r.shape):
            return problem
        r = r.double()
        ours = torch.nan_to_num((a.double() - r).abs(), nan=0.0).max() if a.numel() else 0.0
        theirs = torch.nan_to_num((e.double() - r).abs(), nan=0.0).max() if e.numel() else 0.0
        if torch.isnan(a).ne(torch.isnan(e)).any() or ours > max(theirs, 1e-2):
            return problem
    return None


def _clone(tensors):
    return [t.clone() for t in tensors]


def _call(op, rebuild):
    def fn(*ts):
        args, kwargs = rebuild(ts)
        return op(*args, **kwargs)
    return fn


def _compiled(fn, tensors, fallbacks: set):
    """fn compiled by smelt alone in a fresh Dynamo, run on copies of tensors; its graphs' fallbacks
    are added to `fallbacks`."""
    import torch
    import smelt
    torch._dynamo.reset()
    smelt.observe.reset()
    torch.manual_seed(0)
    actual = torch.compile(fn, backend="smelt")(*_clone(tensors))
    for g in smelt.observe.compiled_graphs():
        fallbacks.update(g.fallback_ops)
    return actual


def _problem(fn, tensors, actual, expected, dtype, tol) -> str | None:
    import torch
    problem = _compare(actual, expected, tol)
    if problem and dtype in (torch.float16, torch.bfloat16):
        problem = _closer_to_float64_than_eager(fn, tensors, actual, expected, problem)
    return problem


def _all_pass_in_one_graph(accepted, dtype, tol, fallbacks: set) -> bool:
    """Whether every sample matches eager when the samples' calls are compiled as one program: one
    Dynamo trace and one compile for the op instead of one per sample (the OpInfo run's time is
    mostly those). Anything short of a pass says nothing: the caller runs the samples one by one,
    which names the sample at fault."""
    counts = [len(tensors) for _, tensors, _ in accepted]

    def every_sample(*flat):
        outputs, start = [], 0
        for (fn, _, _), n in zip(accepted, counts):
            outputs.append(fn(*flat[start:start + n]))
            start += n
        return tuple(outputs)
    flat = [t for _, tensors, _ in accepted for t in tensors]
    found: set[str] = set()
    try:
        actual = _compiled(every_sample, flat, found)
    except Exception:
        return False
    if len(actual) != len(accepted) or any(_problem(fn, tensors, a, expected, dtype, tol)
                                           for (fn, tensors, expected), a in zip(accepted, actual)):
        return False
    fallbacks.update(found)
    return True


def run_op(op, device: str, dtype, max_samples: int) -> OpResult:
    import torch

    start = time.perf_counter()
    name = op_key(op)
    if "empty" in op.name:
        return OpResult(name, "skip", "uninitialized memory: nothing to compare")
    tol = _tolerance(dtype)
    try:
        samples = list(op.sample_inputs(device, dtype, requires_grad=False))
    except Exception as e:
        return OpResult(name, "skip", f"no samples: {type(e).__name__}: {e}")
    accepted = []  # (fn, tensors, eager's result) of the first max_samples samples eager runs
    for sample in samples:
        if len(accepted) >= max_samples:
            break
        tensors, rebuild = _split_tensors(sample)
        fn = _call(op, rebuild)
        try:
            torch.manual_seed(0)
            expected = fn(*_clone(tensors))
            torch.manual_seed(1)
            again = fn(*_clone(tensors))
        except Exception:
            continue  # eager rejects this sample: nothing to compare
        if _compare(again, expected, tol) is not None:
            return OpResult(name, "skip", "random: eager differs between seeds")
        accepted.append((fn, tensors, expected))
    if not accepted:
        return OpResult(name, "skip", "no sample eager accepts")
    fallbacks: set[str] = set()
    if len(accepted) > 1 and _all_pass_in_one_graph(accepted, dtype, tol, fallbacks):
        return OpResult(name, "pass", "", sorted(fallbacks), time.perf_counter() - start)
    for ran, (fn, tensors, expected) in enumerate(accepted, 1):
        try:
            actual = _compiled(fn, tensors, fallbacks)
        except Exception as e:
            message = " ".join(str(e).split())
            return OpResult(name, "error", f"{type(e).__name__}: {message[:300]}", sorted(fallbacks),
                            time.perf_counter() - start)
        problem = _problem(fn, tensors, actual, expected, dtype, tol)
        if problem:
            return OpResult(name, "fail", f"sample {ran}: {problem[:300]}", sorted(fallbacks),
                            time.perf_counter() - start)
    return OpResult(name, "pass", "", sorted(fallbacks), time.perf_counter() - start)


def _alarm(signum, frame):
    raise TimeoutError("op took too long")


def _worker(indices, device, dtype_name, max_samples, timeout):
    import torch
    import warnings
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db
    dtype = getattr(torch, dtype_name)
    results = []
    signal.signal(signal.SIGALRM, _alarm)
    for k in indices:
        op = op_db[k]
        signal.alarm(timeout)
        try:
            result = run_op(op, device, dtype, max_samples)
        except TimeoutError:
            result = OpResult(op_key(op), "error", f"timeout after {timeout} s")
        except Exception as e:  # the runner must finish whatever one op does
            result = OpResult(op_key(op), "error", f"runner: {type(e).__name__}: {e}"[:300])
        finally:
            signal.alarm(0)
        results.append(result)
    return results


def select_ops(device: str, dtype_name: str, names: list[str] | None, sample_every: int = 1, first: int = 0):
    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    dtype = getattr(torch, dtype_name)
    chosen = []
    for k, op in enumerate(op_db):
        if names and op_key(op) not in names and op.name not in names:
            continue
        try:
            if dtype not in op.supported_dtypes(device):
                continue
        except Exception:
            continue
        chosen.append(k)
    return chosen[first::sample_every]


def summarize(results: list[OpResult]) -> dict:
    counted = [r for r in results if r.status != "skip"]
    passed = [r for r in counted if r.status == "pass"]
    core = [r for r in passed if not r.family_excluded]
    lowered = [r for r in core if not r.fallbacks]
    return {
        "ops": len(results), "ran": len(counted), "passed": len(passed),
        "failed": sum(r.status == "fail" for r in counted), "errored": sum(r.status == "error" for r in counted),
        "skipped": len(results) - len(counted),
        "pass_rate": len(passed) / max(1, len(counted)),
        "core_passed": len(core), "core_lowered": len(lowered),
        "core_lowered_rate": len(lowered) / max(1, len(core)),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m smelt.tools.opinfo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--ops", help="comma-separated op names (default: all)")
    parser.add_argument("--samples", type=int, default=3, help="samples per op")
    parser.add_argument("--jobs", type=int, default=usable_cores())
    parser.add_argument("--every", type=int, default=1, help="run every Nth op (a sample of ops, for speed)")
    parser.add_argument("--first", type=int, default=0,
                        help="with --every N, start at the Kth op (0 <= K < N): N runs with K = 0..N-1 cover every op")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per op")
    parser.add_argument("--json", help="write every op's result here")
    parser.add_argument("--verbose", action="store_true", help="also list passing ops that used a fallback")
    args = parser.parse_args(argv)

    names = args.ops.split(",") if args.ops else None
    if not 0 <= args.first < max(1, args.every):
        parser.error(f"--first {args.first}: wants 0 <= K < --every ({args.every})")
    chosen = select_ops(args.device, args.dtype, names, args.every, args.first)
    jobs = max(1, min(args.jobs, len(chosen)))
    # Small chunks taken by whichever worker is free: a few slow ops do not leave the others idle at the end.
    chunks = [chosen[k:k + OPS_PER_TASK] for k in range(0, len(chosen), OPS_PER_TASK)]
    started = time.perf_counter()
    results: list[OpResult] = []
    import multiprocessing
    context = multiprocessing.get_context("spawn")  # CUDA and Triton do not survive fork
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = [pool.submit(_worker, chunk, args.device, args.dtype, args.samples, args.timeout)
                   for chunk in chunks]
        for future in concurrent.futures.as_completed(futures):
            results.extend(future.result())
    results.sort(key=lambda r: r.name)
    for r in results:
        if r.status in ("fail", "error"):
            print(f"{r.status.upper():5} {r.name}: {r.reason}")
        elif args.verbose and r.status == "pass" and r.fallbacks:
            print(f"FALLBACK {r.name}: {', '.join(r.fallbacks)}")
    s = summarize(results)
    print(f"\nsmelt OpInfo {args.device} {args.dtype}: {s['ran']} ops ran, {s['passed']} passed "
          f"({100 * s['pass_rate']:.1f}%), {s['failed']} failed, {s['errored']} errored, {s['skipped']} skipped; "
          f"outside linalg/fft/sparse/special {s['core_lowered']} of {s['core_passed']} passing ops fully lowered "
          f"({100 * s['core_lowered_rate']:.1f}%), the rest with an ATen fallback "
          f"[{time.perf_counter() - started:.0f} s]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": s, "results": [dataclasses.asdict(r) for r in results]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
