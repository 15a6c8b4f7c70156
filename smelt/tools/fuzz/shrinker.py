"""Makes a failing program smaller while it still fails the same way: fewer outputs, ops bypassed or
dropped, inputs without gradients, contiguous, float32, and with smaller sizes."""
from __future__ import annotations

import dataclasses
import time

import torch

from .program import NAME, Op, Program
from .runner import Result, judge_program


def without_dead_code(p: Program) -> Program:
    live = set(p.outputs)
    ops = []
    for op in reversed(p.ops):
        writes_another = any(NAME.match(line) and NAME.match(line).group() != op.out for line in op.lines)
        if op.out in live or writes_another:  # an op writing another value in place stays
            ops.append(op)
            live |= op.uses()
    ops.reverse()
    inputs = [i for i in p.inputs if i.name in live]
    return Program(inputs, ops, p.outputs, p.backward)


def _bypassed(p: Program, k: int, by: str) -> Program:
    """Op k removed, its result replaced by `by` in every later op and the outputs."""
    out = p.ops[k].out

    def sub(text):
        return NAME.sub(lambda m: by if m.group() == out else m.group(), text)
    ops = p.ops[:k] + [Op(o.out, [sub(line) for line in o.lines], o.family, o.group) for o in p.ops[k + 1:]]
    outputs = list(dict.fromkeys(by if o == out else o for o in p.outputs))
    return without_dead_code(Program(p.inputs, ops, outputs, p.backward))


def _with_input(p: Program, k: int, **change) -> Program:
    inputs = list(p.inputs)
    inputs[k] = dataclasses.replace(inputs[k], **change)
    return Program(inputs, p.ops, p.outputs, p.backward)


def candidates(p: Program):
    """Smaller programs, the biggest cuts first."""
    if len(p.outputs) > 1:
        for o in p.outputs:
            yield without_dead_code(Program(p.inputs, p.ops, [o], p.backward))
        for o in p.outputs:
            yield without_dead_code(Program(p.inputs, p.ops, [k for k in p.outputs if k != o], p.backward))
    for k in reversed(range(len(p.ops))):
        for by in sorted(p.ops[k].uses()):
            yield _bypassed(p, k, by)
    if p.backward:
        yield Program(p.inputs, p.ops, p.outputs, False)
    for k, i in enumerate(p.inputs):
        if i.grad:
            yield _with_input(p, k, grad=False)
        if i.layout != "contiguous":
            yield _with_input(p, k, layout="contiguous")
        if i.dtype.is_floating_point and i.dtype != torch.float32:
            yield _with_input(p, k, dtype=torch.float32)
        for d, size in enumerate(i.shape):
            for smaller in dict.fromkeys((1, size // 2, size - 1)):
                if 0 <= smaller < size and size > 1:
                    shape = list(i.shape)
                    shape[d] = smaller
                    yield _with_input(p, k, shape=tuple(shape))
        if i.kind in ("index", "unique") and i.high > 1:
            yield _with_input(p, k, high=i.high - 1)


def same_failure(result: Result, original: Result) -> bool:
    if original.status == "fail":
        return result.status == "fail"
    return result.signature() == original.signature()


def shrink(program: Program, original: Result, device="cpu", budget_s: float = 180.0, timeout: float = 30.0,
           judge=None):
    """(smallest failing program found, its result, number of programs tried). judge: how a candidate is
    judged (default: judge_program, in this process)."""
    judge = judge or judge_program
    best, best_result = program, original
    seen = {program.body()}
    tried = 0
    deadline = time.monotonic() + budget_s
    progress = True
    while progress and time.monotonic() < deadline:
        progress = False
        for cand in candidates(best):
            if time.monotonic() > deadline:
                break
            if not cand.ops or not cand.outputs:
                continue
            key = cand.body() + repr([(i.shape, i.dtype, i.layout, i.grad, i.high) for i in cand.inputs]) + str(cand.backward)
            if key in seen:
                continue
            seen.add(key)
            tried += 1
            result = judge(cand, device, timeout)
            if same_failure(result, original):
                best, best_result, progress = cand, result, True
                break
    return best, best_result, tried
