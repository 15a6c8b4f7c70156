"""The benchmark rows. To add one: write the function, then append a `Workload` to WORKLOADS.

`make_inputs(device, small)` seeds the generator so every backend and every run sees the same data.
`bytes_moved(inputs)` defaults to the floor for a fused kernel: each input read once and each output
written once, with output sizes found by running `fn` on meta tensors. Override it where that floor
is wrong or `fn` cannot run on meta tensors (a module whose parameters live on the GPU).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_leaves

Inputs = tuple[torch.Tensor, ...]

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}

# Tolerances against eager. Reductions may sum in another order, and a fused kernel skips the
# rounding to bf16 between ops that eager does, so one bf16 ulp of difference is expected.
_TOLERANCE = {
    torch.float32: dict(rtol=1e-4, atol=1e-4),
    torch.float16: dict(rtol=1e-2, atol=1e-2),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
}


def randn(count: int) -> Callable[[tuple[int, ...], torch.dtype, str], Inputs]:
    """An input builder: `count` standard-normal tensors of the workload's shape."""

    def build(shape, dtype, device):
        return tuple(torch.randn(shape, dtype=dtype, device=device) for _ in range(count))

    return build


def io_bytes(fn: Callable[..., Any]) -> Callable[[Inputs], int]:
    """Bytes of all inputs plus all outputs; output sizes come from a run on meta tensors (no data)."""

    def count(inputs: Inputs) -> int:
        metas = [torch.empty_like(t, device="meta") if isinstance(t, torch.Tensor) else t for t in inputs]
        outputs = [t for t in tree_leaves(fn(*metas)) if isinstance(t, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in [*inputs, *outputs] if isinstance(t, torch.Tensor))

    return count


@dataclasses.dataclass
class Workload:
    name: str
    fn: Callable[..., Any]
    shape: tuple[int, ...]  # full size, what the H100 runs
    small_shape: tuple[int, ...]  # for `--small` sanity runs on a CPU
    dtype: torch.dtype
    build: Callable[[tuple[int, ...], torch.dtype, str], Inputs] = randn(1)
    bytes_moved: Callable[[Inputs], int] | None = None
    desc: str | None = None  # the shape/dtype column; defaults to "AxB dtype"
    tolerance: dict | None = None  # assert_close kwargs; defaults by dtype
    # Replaces the assert_close check, for rows whose output eager cannot reproduce (dropout's
    # random mask): called as compare(output, eager_output), raises AssertionError on a mismatch.
    compare: Callable[[Any, Any], None] | None = None

    def __post_init__(self):
        if self.bytes_moved is None:
            self.bytes_moved = io_bytes(self.fn)
        if self.tolerance is None:
            self.tolerance = _TOLERANCE.get(self.dtype, {})

    def make_inputs(self, device: str, small: bool = False) -> Inputs:
        torch.manual_seed(0)
        return self.build(self.small_shape if small else self.shape, self.dtype, device)

    def describe(self, small: bool = False) -> str:
        if self.desc and not small:
            return self.desc
        shape = self.small_shape if small else self.shape
        return "x".join(map(str, shape)) + " " + _DTYPE_NAMES.get(self.dtype, str(self.dtype))


def softmax(x):
    return torch.softmax(x, dim=-1)


def layer_norm(x, weight, bias):
    return F.layer_norm(x, x.shape[-1:], weight, bias)


def _layer_norm_inputs(shape, dtype, device):
    (x,) = randn(1)(shape, dtype, device)
    weight = torch.randn(shape[-1], dtype=dtype, device=device)
    bias = torch.randn(shape[-1], dtype=dtype, device=device)
    return x, weight, bias


def silu_mul(a, b):
    return F.silu(a) * b


def transpose_add(x, y):
    return x.t() + y


def permute_021(x):
    return x.permute(0, 2, 1).contiguous()


WORKLOADS: list[Workload] = [
    Workload("softmax", softmax, (32768, 2048), (64, 128), torch.float32),
    Workload("layer_norm", layer_norm, (16384, 4096), (64, 256), torch.float32, build=_layer_norm_inputs),
    Workload("silu_mul", silu_mul, (8192, 14336), (64, 256), torch.bfloat16, build=randn(2)),
    Workload("transpose_add", transpose_add, (8192, 8192), (96, 96), torch.float32, build=randn(2)),
    Workload("permute_021", permute_021, (64, 1024, 1024), (4, 64, 96), torch.bfloat16),
]


def by_name(names: str | None) -> list[Workload]:
    """Workloads named in a comma-separated list, in the list's order; all of them for None."""
    if not names:
        return list(WORKLOADS)
    table = {w.name: w for w in WORKLOADS}
    unknown = [n for n in names.split(",") if n not in table]
    if unknown:
        raise SystemExit(f"unknown workload(s) {unknown}; known: {sorted(table)}")
    return [table[n] for n in names.split(",")]
