"""Random programs: a few ops drawn from ops.FAMILIES, each kept only where eager runs it."""
from __future__ import annotations

import random
import warnings

import torch

from .builder import Builder
from .ops import FAMILIES
from .program import Program, merged
from ..accuracy import to_float64
from .runner import exact_clone, make_inputs, run_once


def generate(seed: int, device="cpu", backward=True, min_ops=2, max_ops=8) -> Program:
    """The program for `seed`: the same seed always gives the same program."""
    rng = random.Random(seed)
    for _ in range(20):
        # Built on the CPU whatever the device: each op is kept only where eager runs it, and on CUDA an
        # index out of range is a device-side assert that ends the process, not an exception.
        b = Builder(rng, "cpu", backward)
        want = rng.randint(min_ops, max_ops)
        names, weights = zip(*[(n, w) for n, (_, w) in FAMILIES.items()])
        tries = 0
        while len(b.ops) < want and tries < want * 6:
            tries += 1
            FAMILIES[rng.choices(names, weights)[0]][0](b)
        if not b.ops:
            continue
        program = b.program()
        if _runs_on(program, device):
            return program
        if backward:
            program.backward = False
            if _runs_on(program, device):
                return program
    raise RuntimeError(f"no valid program for seed {seed}")


def generate_batch(seed: int, size: int, device="cpu", backward=True) -> Program:
    """`size` independent programs as one (one compile); each keeps its group number."""
    return merged([generate(seed * 1000 + k, device, backward) for k in range(size)])


def _runs_on(program: Program, device) -> bool:
    return _runs(program, "cpu") and (device == "cpu" or _runs(program, device))


def _runs(program: Program, device) -> bool:
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn = program.function()
            eager = run_once(fn, make_inputs(program, device), program.backward)
            again = run_once(fn, make_inputs(program, device), program.backward)
            if not _same(eager[:3], again[:3]):  # eager reading memory it should not (see ops.norm)
                return False
            run_once(program.function(reference=True), to_float64([exact_clone(i) for i in make_inputs(program, device)]), program.backward,
                     eager[3])  # the float64 reference must run too: without it only closeness to eager counts
        return True
    except Exception:
        return False


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a.detach().nan_to_num(7.0), b.detach().nan_to_num(7.0))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is b or a == b
