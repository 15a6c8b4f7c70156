"""A tiled pointwise kernel's blocks and launch grid (the tiling itself is the scheduler's choice,
scheduler/tiling.py): how big each program's tile is, and how program ids map onto the tile axes."""
from __future__ import annotations

from ... import artifact
from ...artifact import TileBlocks
from ...scheduler.tiling import Tiling
from ...symbolic import next_power_of_2, static_int


# Elements of a tile chosen for its row values (scheduler/tiling.py `_rows_for_row_values`), over 4
# warps: its elements take an exp or a division each, where a transpose's only move. The best of
# 1024-8192 across four BN + activation shapes (benchmarks/probes/row_value_tiles.py, H200).
ROW_VALUE_TILE = 2048


def tile_blocks(tiling: Tiling, itemsize: int, interpret: bool, shrink: int = 1) -> TileBlocks:
    """The tile: on the GPU, 64 x 64 for 4-byte elements and 128 x 64 for narrower ones (each row
    and column of the tile a few 128-byte lines; on an H100 these copy at 85-95% of the copy
    bandwidth, where 32 x 32 tiles lose 5-10%). Under the interpreter, where each program is a
    round of numpy calls, as big as 128 x 128. A short side gives its room to the other. `shrink`
    divides the budget for kernels that load many values per element."""
    xn, rn = static_int(tiling.outer), static_int(tiling.inner)
    if interpret:
        budget, side = 1 << 14, 128
    elif tiling.row_values:
        budget, side = ROW_VALUE_TILE // shrink, 64
    else:
        budget, side = (8192 if itemsize <= 2 else 4096) // shrink, 64
    rblock = min(side, next_power_of_2(rn)) if rn is not None else side
    xblock = min(budget // rblock, next_power_of_2(xn)) if xn is not None else budget // rblock
    if rn is not None:
        rblock = min(budget // xblock, next_power_of_2(rn))
    num_warps = 8 if xblock * rblock >= 4096 and not tiling.row_values else 4
    first = "x" if len(tiling.along_x) > len(tiling.along_r) else "r"
    return TileBlocks(xblock, rblock, num_warps, *grid_layout(xn, rn, xblock, rblock, first))


def grid_layout(xn: int | None, rn: int | None, xblock: int, rblock: int,
                first: str) -> tuple[tuple[str, str], bool]:
    """(grid_axes, fold_axis1) for static sizes xn, rn (None when symbolic). Consecutive programs
    walk the `first` axis: the one most accesses are contiguous along, so that programs running
    together cover whole rows of those buffers (x.t() + y: 98% of copy bandwidth walking x first,
    96% walking r; a 3-D permute 97% against 92%). Axis 1 folds onto axis 2 unless it surely fits."""
    axes = (first, "r" if first == "x" else "x")
    x_programs = -(-xn // xblock) if xn is not None else None
    r_programs = -(-rn // rblock) if rn is not None else None
    second = x_programs if axes[1] == "x" else r_programs
    return axes, second is None or second > artifact.GRID_AXIS_LIMIT


def tile_program_ids(tiles: TileBlocks, cast: str) -> dict[str, str]:
    """Triton expressions for this program's x block and r block numbers."""
    first, second = tiles.grid_axes
    pids = {first: f"tl.program_id(0){cast}"}
    if tiles.fold_axis1:
        pids[second] = f"(tl.program_id(2){cast} * {artifact.GRID_AXIS_LIMIT} + tl.program_id(1){cast})"
    else:
        pids[second] = f"tl.program_id(1){cast}"
    return pids

