"""The random ops printed in Halide: the same Philox values as smelt's Triton kernels.

A value is a pure function of (seed, offset), so any kernel that recomputes it gets the same
number. `philox` below is Triton's Philox4x32 with 10 rounds (tl.randint4x): the uniform value
at offset i is word i % 4 of the block at counter i // 4, read as Triton's tl.rand4x reads it;
randn is tl.randn's Box-Muller of words 0 and 1 at counter i; randint64 joins words 0 and 1.
"""
from __future__ import annotations

import torch

from ..common import CSEVar

PHILOX_HELPER = '''

def umulhi(a, b):
    return hl.cast(hl.UInt(32), (hl.cast(hl.UInt(64), a) * hl.cast(hl.UInt(64), b)) >> 32)


def philox(seed, counter):
    """The four 32-bit words of Philox4x32-10 for key seed and counter (as tl.randint4x)."""
    seed, counter = hl.cast(hl.UInt(64), seed), hl.cast(hl.UInt(64), counter)
    k0, k1 = hl.cast(hl.UInt(32), seed & hl.u64(0xFFFFFFFF)), hl.cast(hl.UInt(32), seed >> 32)
    c0, c1 = hl.cast(hl.UInt(32), counter & hl.u64(0xFFFFFFFF)), hl.cast(hl.UInt(32), counter >> 32)
    c2 = c3 = hl.u32(0)
    a, b = hl.u32(0xD2511F53), hl.u32(0xCD9E8D57)
    for _ in range(10):
        c0, c1, c2, c3 = umulhi(b, c2) ^ c1 ^ k0, b * c2, umulhi(a, c0) ^ c3 ^ k1, a * c0
        k0, k1 = k0 + hl.u32(0x9E3779B9), k1 + hl.u32(0xBB67AE85)
    return c0, c1, c2, c3


def uniform(word):
    """A 32-bit word as a float32 in [0, 1), as Triton's uint_to_uniform_float."""
    signed = hl.reinterpret(hl.Int(32), word)
    return hl.cast(hl.Float(32), hl.select(signed < 0, ~signed, signed)) * hl.f32(4.6566127342e-10)
'''


def _words(kernel, seed: CSEVar, counter: str, rank: int) -> str:
    kernel.uses_random = True
    name = kernel.fresh("words")
    kernel.body.writeline(f"{name} = philox({seed}, {counter})")
    return name


def uniform(kernel, seed: CSEVar, offset: CSEVar) -> CSEVar:
    words = _words(kernel, seed, f"{offset} // 4", offset.rank)
    word = kernel.emit(f"{offset} % 4", offset.dtype, offset.rank)
    pick = (f"hl.select({word} == 0, {words}[0], hl.select({word} == 1, {words}[1], "
            f"hl.select({word} == 2, {words}[2], {words}[3])))")
    return kernel.emit(f"uniform({pick})", torch.float32, offset.rank)


def normal(kernel, seed: CSEVar, offset: CSEVar) -> CSEVar:
    words = _words(kernel, seed, offset.name, offset.rank)
    u1 = kernel.emit(f"hl.max(hl.f32(1.0e-7), uniform({words}[0]))", torch.float32, offset.rank)
    u2 = kernel.emit(f"uniform({words}[1])", torch.float32, offset.rank)
    return kernel.emit(f"hl.sqrt(hl.f32(-2.0) * hl.log({u1})) * hl.cos(hl.f32(6.283185307179586) * {u2})",
                       torch.float32, offset.rank)


def randint64(kernel, seed: CSEVar, offset: CSEVar, low: CSEVar, high: CSEVar) -> CSEVar:
    words = _words(kernel, seed, offset.name, offset.rank)
    bits = kernel.emit(f"(hl.cast(hl.UInt(64), {words}[0]) << 32) | hl.cast(hl.UInt(64), {words}[1])",
                       torch.int64, offset.rank)
    span = f"hl.cast(hl.UInt(64), hl.cast(hl.Int(64), {high}) - hl.cast(hl.Int(64), {low}))"
    return kernel.emit(f"hl.cast(hl.Int(64), {low}) + hl.cast(hl.Int(64), {bits} % {span})", torch.int64,
                       offset.rank)
