"""Hand-written forms of the long-row softmax, timed in one GPU call, to find what keeps smelt's
row-split kernel (one program per chunk, a barrier per row) under the copy-bandwidth floor.

    python3 -m benchmarks.probes.row_split_variants [--rows 256 --cols 262144]

Besides softmax forms it times plain copies of the same chunk shape, with and without the ticket
and the barrier, so the cost of each piece of the row-split protocol shows on its own. Each
softmax form is checked against eager first; the table gives ms, % of the measured copy bandwidth
for one read and one write, and the registers each thread needs (occupancy).
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


from benchmarks.measure import copy_bandwidth


@triton.jit
def _pause(x):
    # Back off between polls of a barrier counter so spinning programs leave the L2 alone.
    return tl.inline_asm_elementwise("nanosleep.u32 200; mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _reset(sync_ptr, size, FINISH_SEM: tl.constexpr):
    finished = tl.atomic_add(sync_ptr + 1, 1, sem=FINISH_SEM)
    if finished == tl.num_programs(0) - 1:
        for start in range(0, size, 1024):
            clear = start + tl.arange(0, 1024)
            tl.store(sync_ptr + clear, tl.zeros([1024], tl.int32), clear < size)


@triton.jit
def chunk_softmax(x_ptr, out_ptr, sync_ptr, part_ptr, rows, N: tl.constexpr, CHUNK: tl.constexpr,
                  SPLIT: tl.constexpr, TICKET: tl.constexpr, SLEEP: tl.constexpr,
                  FINISH_SEM: tl.constexpr, EVICT: tl.constexpr):
    """smelt's row-split form: one program per chunk, placed by ticket (or program id)."""
    if TICKET:
        t = tl.atomic_add(sync_ptr, 1)
    else:
        t = tl.program_id(0)
    row = t // SPLIT
    c = t % SPLIT
    offs = tl.arange(0, CHUNK)
    v = tl.load(x_ptr + row * N + c * CHUNK + offs, eviction_policy=EVICT)
    m = tl.max(v, 0)
    s = tl.sum(tl.exp(v - m), 0)
    tl.store(part_ptr + row * SPLIT + c, m)
    tl.store(part_ptr + rows * SPLIT + row * SPLIT + c, s)
    tl.debug_barrier()
    arrived = tl.atomic_add(sync_ptr + 2 + row, 1, sem="acq_rel") + 1
    while arrived < SPLIT:
        if SLEEP:
            arrived = _pause(arrived)
        arrived = tl.atomic_add(sync_ptr + 2 + row, 0, sem="acquire")
    lanes = tl.arange(0, SPLIT)
    ms = tl.load(part_ptr + row * SPLIT + lanes, cache_modifier=".cg")
    ss = tl.load(part_ptr + rows * SPLIT + row * SPLIT + lanes, cache_modifier=".cg")
    big = tl.max(ms, 0)
    total = tl.sum(ss * tl.exp(ms - big), 0)
    tl.store(out_ptr + row * N + c * CHUNK + offs, tl.exp(v - big) / total)
    _reset(sync_ptr, 2 + rows, FINISH_SEM)


@triton.jit
def persistent_softmax(x_ptr, out_ptr, sync_ptr, part_ptr, rows, N: tl.constexpr, CHUNK: tl.constexpr,
                       SPLIT: tl.constexpr, SLEEP: tl.constexpr, FINISH_SEM: tl.constexpr):
    """A fixed number of programs, each taking chunk after chunk by ticket. The next ticket is taken
    once the row's barrier is passed, before the output is stored, so its latency hides behind the
    store; a program never waits while it holds a ticket it has not arrived with."""
    total_chunks = rows * SPLIT
    offs = tl.arange(0, CHUNK)
    lanes = tl.arange(0, SPLIT)
    t = tl.atomic_add(sync_ptr, 1)
    while t < total_chunks:
        row = t // SPLIT
        c = t % SPLIT
        v = tl.load(x_ptr + row * N + c * CHUNK + offs)
        m = tl.max(v, 0)
        s = tl.sum(tl.exp(v - m), 0)
        tl.store(part_ptr + row * SPLIT + c, m)
        tl.store(part_ptr + rows * SPLIT + row * SPLIT + c, s)
        tl.debug_barrier()
        arrived = tl.atomic_add(sync_ptr + 2 + row, 1, sem="acq_rel") + 1
        while arrived < SPLIT:
            if SLEEP:
                arrived = _pause(arrived)
            arrived = tl.atomic_add(sync_ptr + 2 + row, 0, sem="acquire")
        ms = tl.load(part_ptr + row * SPLIT + lanes, cache_modifier=".cg")
        ss = tl.load(part_ptr + rows * SPLIT + row * SPLIT + lanes, cache_modifier=".cg")
        big = tl.max(ms, 0)
        total = tl.sum(ss * tl.exp(ms - big), 0)
        t = tl.atomic_add(sync_ptr, 1)
        tl.store(out_ptr + row * N + c * CHUNK + offs, tl.exp(v - big) / total)
    _reset(sync_ptr, 2 + rows, FINISH_SEM)


@triton.jit
def chunk_copy(x_ptr, out_ptr, sync_ptr, part_ptr, rows, N: tl.constexpr, CHUNK: tl.constexpr,
               SPLIT: tl.constexpr, TICKET: tl.constexpr, BARRIER: tl.constexpr):
    """The same chunks copied: the floor of this access pattern, then with the ticket, then with
    the barrier (no arithmetic)."""
    if TICKET:
        t = tl.atomic_add(sync_ptr, 1)
    else:
        t = tl.program_id(0)
    row = t // SPLIT
    c = t % SPLIT
    offs = tl.arange(0, CHUNK)
    v = tl.load(x_ptr + row * N + c * CHUNK + offs)
    if BARRIER:
        tl.store(part_ptr + row * SPLIT + c, tl.max(v, 0))
        tl.debug_barrier()
        arrived = tl.atomic_add(sync_ptr + 2 + row, 1, sem="acq_rel") + 1
        while arrived < SPLIT:
            arrived = tl.atomic_add(sync_ptr + 2 + row, 0, sem="acquire")
        v = v + tl.max(tl.load(part_ptr + row * SPLIT + tl.arange(0, SPLIT), cache_modifier=".cg"), 0) * 0
    tl.store(out_ptr + row * N + c * CHUNK + offs, v)
    if TICKET or BARRIER:
        _reset(sync_ptr, 2 + rows, "acq_rel")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--cols", type=int, default=262144)
    args = parser.parse_args()
    rows, cols = args.rows, args.cols
    bw = copy_bandwidth("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.randn(rows, cols, device="cuda")
    expected = torch.softmax(x, dim=-1)
    bytes_moved = 2 * x.numel() * 4
    out = torch.empty_like(x)
    table = []

    def time(label, launch, check):
        sync = torch.zeros(2 + rows, dtype=torch.int32, device="cuda")
        part = torch.empty(2 * rows * 64, dtype=torch.float32, device="cuda")
        try:
            out.fill_(float("nan"))
            compiled = launch(sync, part)
            torch.cuda.synchronize()
            if check:
                torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-6)
            else:
                torch.testing.assert_close(out, x)
            assert int(sync.abs().sum()) == 0, "sync buffer not reset"
            ms = do_bench(lambda: launch(sync, part), return_mode="median")
            regs = getattr(compiled, "n_regs", "?")
            table.append((label, f"{ms:.4f}", f"{bytes_moved / (ms * 1e-3) / bw:.0%}", regs))
        except Exception as e:  # noqa: BLE001 - report the variant, go on with the others
            table.append((label, f"{type(e).__name__}: {str(e).splitlines()[0][:70]}", "-", "-"))

    for chunk, warps in [(8192, 8), (8192, 4), (4096, 4)]:
        split = cols // chunk
        grid = (rows * split,)
        for ticket, sleep, finish, evict, name in [
            (True, False, "acq_rel", "", "smelt's form"),
            (True, False, "relaxed", "", "finish counter relaxed"),
            (True, True, "acq_rel", "", "nanosleep between polls"),
            (True, False, "acq_rel", "evict_first", "evict_first chunk load"),
            (False, False, "acq_rel", "", "program id placement (no ticket)"),
        ]:
            time(f"{name}, chunk {chunk}, {warps} warps",
                 lambda s, p, ticket=ticket, sleep=sleep, finish=finish, evict=evict, split=split, chunk=chunk,
                 warps=warps, grid=grid: chunk_softmax[grid](
                     x, out, s, p, rows, cols, chunk, split, ticket, sleep, finish, evict, num_warps=warps),
                 True)
        for per_sm in (2, 3, 4, 6):
            for sleep in (False, True):
                pgrid = (min(rows * split, per_sm * sms),)
                time(f"persistent {per_sm}/SM{' + nanosleep' if sleep else ''}, chunk {chunk}, {warps} warps",
                     lambda s, p, sleep=sleep, split=split, chunk=chunk, warps=warps, pgrid=pgrid:
                     persistent_softmax[pgrid](x, out, s, p, rows, cols, chunk, split, sleep, "acq_rel",
                                               num_warps=warps),
                     True)
        for ticket, barrier, name in [(False, False, "copy"), (True, False, "copy + ticket"),
                                      (True, True, "copy + ticket + barrier")]:
            time(f"{name}, chunk {chunk}, {warps} warps",
                 lambda s, p, ticket=ticket, barrier=barrier, split=split, chunk=chunk, warps=warps, grid=grid:
                 chunk_copy[grid](x, out, s, p, rows, cols, chunk, split, ticket, barrier, num_warps=warps),
                 False)
    eager = do_bench(lambda: torch.softmax(x, dim=-1), return_mode="median")
    table.append(("eager torch.softmax", f"{eager:.4f}", f"{bytes_moved / (eager * 1e-3) / bw:.0%}", "-"))
    print(f"\n### long-row softmax variants, {rows} x {cols} fp32 (copy BW {bw / 1e9:.0f} GB/s, {sms} SMs)\n")
    print("| variant | ms | % of copy BW | regs/thread |\n|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(str(v) for v in row) + " |")


if __name__ == "__main__":
    main()
