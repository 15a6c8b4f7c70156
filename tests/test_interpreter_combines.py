"""Triton's interpreter runs reductions and scans with a combine function of their own as a tree over
whole arrays (runtime/interpreter_combines.py), not element by element: the order of the operands
is kept, so a combine that is associative but not commutative gives the sequential fold's result."""
import numpy as np
import pytest
import torch

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def then(a1, b1, a2, b2):
    # x -> a1 * x + b1, then x -> a2 * x + b2: associative, not commutative
    return a1 * a2, b1 * a2 + b2


@triton.jit
def compose(A, B, RA, RB, SA, SB, ROWS: tl.constexpr, COLS: tl.constexpr, REVERSE: tl.constexpr):
    rows = tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, COLS)[None, :]
    a = tl.load(A + rows * COLS + cols)
    b = tl.load(B + rows * COLS + cols)
    ra, rb = tl.reduce((a, b), 1, then)
    tl.store(RA + tl.arange(0, ROWS), ra)
    tl.store(RB + tl.arange(0, ROWS), rb)
    sa, sb = tl.associative_scan((a, b), 1, then, reverse=REVERSE)
    tl.store(SA + rows * COLS + cols, sa)
    tl.store(SB + rows * COLS + cols, sb)
'''


def _fold(pairs):
    a, b = pairs[0]
    for a2, b2 in pairs[1:]:
        a, b = a * a2, b * a2 + b2
    return a, b


@pytest.mark.cpu_backend_independent  # the interpreter's own reductions, whichever backend is under test
@pytest.mark.parametrize("reverse", [False, True])
def test_a_non_commutative_combine_reduces_and_scans_in_order(tmp_path, monkeypatch, reverse):
    from smelt.runtime import interpreter_combines, interpreter_compat
    from smelt.runtime.loader import load_module
    path = tmp_path / "affine_compose.py"
    path.write_text(KERNEL)
    module = load_module(str(path), interpret=True)
    interpreter_compat.install()
    combines = []
    real = interpreter_combines._combine
    monkeypatch.setattr(interpreter_combines, "_combine", lambda *a: combines.append(1) or real(*a))
    rows, cols = 4, 64
    gen = torch.Generator().manual_seed(0)
    a = torch.where(torch.rand(rows, cols, generator=gen) < 0.5, -1, 1).int()  # exact in int32
    b = torch.randint(-3, 4, (rows, cols), generator=gen, dtype=torch.int32)
    ra, rb = torch.empty(rows, dtype=torch.int32), torch.empty(rows, dtype=torch.int32)
    sa, sb = torch.empty_like(a), torch.empty_like(b)
    module.compose[(1,)](a, b, ra, rb, sa, sb, ROWS=rows, COLS=cols, REVERSE=reverse)
    # log2(64) = 6 array-wide combines for the reduction and 6 for the scan, not 63 each
    assert len(combines) == 12, len(combines)
    for r in range(rows):
        pairs = list(zip(a[r].tolist(), b[r].tolist()))
        assert (ra[r].item(), rb[r].item()) == _fold(pairs)
        for c in range(cols):
            prefix = pairs[c:][::-1] if reverse else pairs[:c + 1]
            assert (sa[r, c].item(), sb[r, c].item()) == _fold(prefix), (r, c)
    assert np.any(sb.numpy() != sb.numpy()[:, :1])  # not a degenerate input
