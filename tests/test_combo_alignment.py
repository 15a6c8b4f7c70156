"""Combo kernels load whole vectors where their buffers allow it (codegen/triton/combo.py).

A combo member's pointers come from a table, so Triton knows nothing of their alignment: without
a hint it moved bf16 two bytes at a time (Whisper's key and value transposes as one combo took 15.4
us on the H200, as two kernels 4.7 each). The binary for buffers all 16-byte aligned marks them so;
a call with any buffer off that launches the binary that does not (runtime/combo_launcher.py)."""
import pytest
import torch
import triton
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import smelt
from conftest import inspects_triton_kernels
from smelt.pipeline import generate_graph
from smelt.runtime.launcher import TritonLauncher
from smelt.runtime.loader import load_module


def _heads_first(k, v):
    # Whisper's key and value: [batch, time, heads * dim] -> [batch, heads, time, dim], copied
    # (ATen ops, as AOTAutograd gives them: traced on fake CUDA tensors)
    aten = torch.ops.aten
    return [aten.clone.default(aten.transpose.int(aten.view.default(x, [2, 100, 6, 64]), 1, 2),
                               memory_format=torch.contiguous_format) for x in (k, v)]


def _vector_ops(kernel, tmp_path, align: int) -> dict[str, int]:
    path = tmp_path / f"{kernel.name}.py"
    path.write_text(kernel.source)
    fn = getattr(load_module(str(path), interpret=False), kernel.name)
    source = ASTSource(fn,
                       {"work_ptr": "*i32", "table_ptr": "*i64", "XBLOCK": "constexpr", "POINTER_ALIGN": "constexpr"},
                       constexprs={"XBLOCK": kernel.config.XBLOCK, "POINTER_ALIGN": align})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    return {op: ptx.count(op) for op in ("ld.global.v4", "st.global.v4", "ld.global.b16", "st.global.b16")}


@pytest.mark.smelt_only
@pytest.mark.cpu_backend_independent
def test_an_aligned_combo_moves_whole_vectors_and_an_unaligned_one_compiles(tmp_path):
    with FakeTensorMode():
        args = [torch.empty(2, 100, 384, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        gm = make_fx(_heads_first)(*args)
    with smelt.config.override(cuda_backend="triton"):
        g = generate_graph(gm, "inference", smelt.config.current())
    (kernel,) = [k for k in g.kernels if not k.interpret]
    assert kernel.combo is not None, g.wrapper_source
    assert "POINTER_ALIGN)" in kernel.source and "tl.multiple_of(tl.load(slots + 2), 16)" in kernel.source, kernel.source
    aligned = _vector_ops(kernel, tmp_path, 16)
    assert aligned["ld.global.v4"] and aligned["st.global.v4"] and not aligned["ld.global.b16"], aligned
    unaligned = _vector_ops(kernel, tmp_path, 1)
    assert unaligned["ld.global.b16"] and not unaligned["ld.global.v4"], unaligned


def _decay(ps):
    # In place, as an optimizer's update: one combo launch whose buffers are the inputs themselves.
    for i, p in enumerate(ps):
        p.mul_(0.5).add_(i)


def test_buffers_off_alignment_launch_the_binary_that_does_not_assume_it(device, compile_fn, assert_close,
                                                                         monkeypatch):
    inspects_triton_kernels()
    made = []
    with_constants = TritonLauncher.with_constants
    monkeypatch.setattr(TritonLauncher, "with_constants",
                        lambda self, **c: made.append(c) or with_constants(self, **c))
    torch._dynamo.reset()
    compiled = compile_fn(_decay)
    # Parameters one float past their storages' starts (4 bytes: a flat buffer's views are so).
    ps = [torch.randn(64 * (i + 1) + 1, device=device)[1:] for i in range(4)]
    want = [p.clone() for p in ps]
    for _ in range(2):
        compiled(ps)
        _decay(want)
        for got, w in zip(ps, want):
            assert_close(got, w)
    assert made == [{"POINTER_ALIGN": 1}], made
    aligned = [torch.randn(64 * (i + 1), device=device) for i in range(4)]  # the aligned binary again
    want = [p.clone() for p in aligned]
    compiled(aligned)
    _decay(want)
    for got, w in zip(aligned, want):
        assert_close(got, w)
