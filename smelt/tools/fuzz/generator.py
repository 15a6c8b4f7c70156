"""Random programs: a few ops drawn from ops.FAMILIES, each kept only where eager runs it."""
from __future__ import annotations

import random
import warnings

import torch

from .builder import Builder
from .ops import FAMILIES
from .program import Program, merged
from .runner import make_inputs, run_once


def generate(seed: int, device="cpu", backward=True, min_ops=2, max_ops=8) -> Program:
    """The program for `seed`: the same seed always gives the same program."""
    rng = random.Random(seed)
    for _ in range(20):
        b = Builder(rng, device, backward)
        want = rng.randint(min_ops, max_ops)
        names, weights = zip(*[(n, w) for n, (_, w) in FAMILIES.items()])
        tries = 0
        while len(b.ops) < want and tries < want * 6:
            tries += 1
            FAMILIES[rng.choices(names, weights)[0]][0](b)
        if not b.ops:
            continue
        program = b.program()
        if _runs(program, device):
            return program
        if backward:
            program.backward = False
            if _runs(program, device):
                return program
    raise RuntimeError(f"no valid program for seed {seed}")


def generate_batch(seed: int, size: int, device="cpu", backward=True) -> Program:
    """`size` independent programs as one (one compile); each keeps its group number."""
    return merged([generate(seed * 1000 + k, device, backward) for k in range(size)])


def _runs(program: Program, device) -> bool:
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_once(program.function(), make_inputs(program, device), program.backward)
        return True
    except Exception:
        return False
