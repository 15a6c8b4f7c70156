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


def _with_affine(bias: bool):
    """Input builder: x plus a weight (and a bias) over x's last dim."""

    def build(shape, dtype, device):
        (x,) = randn(1)(shape, dtype, device)
        params = [torch.randn(shape[-1], dtype=dtype, device=device) for _ in range(2 if bias else 1)]
        return (x, *params)

    return build


def silu_mul(a, b):
    return F.silu(a) * b


def add_rms_norm(x, residual, weight):
    # The residual stream of a pre-norm transformer: the sum is both kept and normalized.
    h = x + residual
    variance = h.float().pow(2).mean(-1, keepdim=True)
    return (h.float() * torch.rsqrt(variance + 1e-6)).to(h.dtype) * weight, h


def _add_rms_norm_inputs(shape, dtype, device):
    x, residual = randn(2)(shape, dtype, device)
    return x, residual, torch.randn(shape[-1], dtype=dtype, device=device)


def cross_entropy(logits, target):
    return F.cross_entropy(logits, target)


def _cross_entropy_inputs(shape, dtype, device):
    (logits,) = randn(1)(shape, dtype, device)
    return logits, torch.randint(0, shape[-1], shape[:1], device=device)


def column_sum(x):
    return x.sum(0)


def var_mean(x):
    return torch.var_mean(x, dim=-1)


def cumsum(x):
    return torch.cumsum(x, dim=-1)


def transpose_add(x, y):
    return x.t() + y


def global_sum(x):
    return x.sum()


def dropout(x):
    return F.dropout(x, p=0.1, training=True)


def _dropout_matches(out, expected):
    """Dropout's mask comes from a different generator: check its law, not its bits. Kept
    elements are x / (1 - p), and close to 10% are zero."""
    del expected
    x = _dropout_matches.inputs[0]
    kept = out != 0
    torch.testing.assert_close(out[kept], (x[kept] / 0.9).to(out.dtype), rtol=1e-2, atol=1e-2)
    dropped = 1.0 - kept.float().mean().item()
    if not 0.09 < dropped < 0.11:
        raise AssertionError(f"dropout zeroed {dropped:.4f} of the elements, expected about 0.1")


def _dropout_inputs(shape, dtype, device):
    inputs = randn(1)(shape, dtype, device)
    _dropout_matches.inputs = inputs  # the comparison needs x; compare() only sees outputs
    return inputs


class TransformerBlock(torch.nn.Module):
    """A pre-norm GPT block: attention (causal SDPA) and a GELU MLP, each with a residual."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


_blocks: dict = {}


def transformer_block(x):
    return _blocks[(x.device.type, x.dtype, x.shape[-1])](x)


def _transformer_inputs(shape, dtype, device):
    (x,) = randn(1)(shape, dtype, device)
    block = TransformerBlock(shape[-1], heads=shape[-1] // 64).to(device=device, dtype=dtype)
    block.requires_grad_(False)  # inference: the forward pass alone
    _blocks[(torch.device(device).type, dtype, shape[-1])] = block
    return (x,)


def _not_memory_bound(inputs) -> None:
    return None  # matrix products dominate: no bytes-moved floor to compare against


WORKLOADS: list[Workload] = [
    Workload("silu_mul", silu_mul, (8192, 14336), (64, 256), torch.bfloat16, build=randn(2)),
    Workload("add_rms_norm", add_rms_norm, (16384, 4096), (64, 256), torch.bfloat16, build=_add_rms_norm_inputs),
    Workload("layer_norm", layer_norm, (16384, 4096), (64, 256), torch.float32, build=_with_affine(bias=True)),
    Workload("softmax", softmax, (32768, 2048), (64, 128), torch.float32),
    Workload("softmax_long", softmax, (256, 262144), (4, 8192), torch.float32),
    Workload("cross_entropy", cross_entropy, (8192, 32768), (64, 1024), torch.bfloat16,
             build=_cross_entropy_inputs),
    # Sums of 32768 elements: a different summation order moves near-zero results by ~1e-4.
    Workload("column_sum", column_sum, (32768, 4096), (256, 64), torch.float32, tolerance=dict(rtol=1e-4, atol=1e-3)),
    Workload("var_mean", var_mean, (32768, 2048), (64, 128), torch.float32),
    Workload("cumsum", cumsum, (32768, 2048), (64, 128), torch.float32),
    Workload("transpose_add", transpose_add, (8192, 8192), (96, 96), torch.float32, build=randn(2)),
    Workload("global_sum", global_sum, (1 << 26,), (1 << 14,), torch.float32,
             tolerance=dict(rtol=1e-4, atol=1e-2)),
    Workload("dropout", dropout, (8192, 8192), (64, 128), torch.bfloat16, build=_dropout_inputs,
             compare=_dropout_matches),
    Workload("transformer_block", transformer_block, (8, 1024, 1024), (1, 16, 128), torch.bfloat16,
             build=_transformer_inputs, bytes_moved=_not_memory_bound, tolerance=dict(rtol=5e-2, atol=5e-2)),
]


def suite(device: str = "cuda") -> list[Workload]:
    """The rows for a device: the GPU rows, or on a CPU the same kernels at CPU sizes."""
    if device == "cpu":
        from benchmarks.cpu_workloads import CPU_WORKLOADS
        return CPU_WORKLOADS
    return WORKLOADS


def by_name(names: str | None, device: str = "cuda") -> list[Workload]:
    """Workloads of the device's suite named in a comma-separated list, in the list's order; all
    of them for None."""
    workloads = suite(device)
    if not names:
        return list(workloads)
    table = {w.name: w for w in workloads}
    unknown = [n for n in names.split(",") if n not in table]
    if unknown:
        raise SystemExit(f"unknown workload(s) {unknown}; known: {sorted(table)}")
    return [table[n] for n in names.split(",")]
