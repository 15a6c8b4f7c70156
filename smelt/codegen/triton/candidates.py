"""Block configurations worth timing for one kernel, when autotuning is on.

Every candidate shares the kernel's source: the same structure (persistent or looped, row split
or not) and the same masks, so they differ only in constexpr block sizes and num_warps. The
heuristic's choice comes first, and is what runs when autotuning is off.
"""
from __future__ import annotations

import dataclasses

from ...artifact import BlockConfig, TileBlocks
from ...symbolic import next_power_of_2, static_int
from .kernel import ROW_ELEMENTS_PER_WARP, SHORT_ROW
from .tiles import grid_layout

# At most this many elements in one program's block: beyond it registers spill.
MAX_BLOCK_ELEMENTS = 16384


# (x, r, num_warps) of the tiles timed for a tiled kernel, beside the heuristic's: tall, square and
# wide, from 1k to 8k elements (a depthwise window's many loads want small tiles, a transpose big ones;
# no one tile won across MobileNetV3's and EfficientNet's window kernels on the H200).
TILE_SHAPES = ((128, 16, 4), (64, 32, 4), (32, 32, 4), (32, 64, 4), (64, 64, 4), (128, 64, 8), (256, 32, 8))


def candidates(plan, heuristic) -> list:
    if heuristic.row_split > 1 or plan.has_scan or any(n.is_scatter for n in plan.nodes):
        return [heuristic]
    if heuristic.tiles is not None:
        return _tile_candidates(plan, heuristic)
    xn, rn = plan.static_sizes()
    if xn is None or (plan.is_reduction and rn is None):
        return [heuristic]
    found = [heuristic]

    def add(**change):
        config = dataclasses.replace(heuristic, **change)
        x = config.XBLOCK
        if x > next_power_of_2(xn) or x * (config.RBLOCK or 1) > MAX_BLOCK_ELEMENTS or config in found:
            return
        found.append(config)

    if not plan.is_reduction:
        for xblock, warps in ((512, 4), (1024, 8), (2048, 8), (256, 4)):
            add(XBLOCK=xblock, num_warps=warps)
    elif heuristic.persistent:
        for xblock in (1, 2, 4, 8):
            for warps in (4, 8, 16):
                elements = xblock * heuristic.RBLOCK
                if elements // (warps * 32) >= 4 or warps == 4:  # at least 4 values a thread
                    add(XBLOCK=xblock, num_warps=warps)
    else:
        for xblock, rblock, warps in ((1, 2048, 8), (1, 4096, 8), (2, 1024, 8), (4, 512, 4), (1, 1024, 4)):
            add(XBLOCK=xblock, RBLOCK=rblock, num_warps=warps)
    return found


def row_candidates(plan, heuristic) -> list:
    """A persistent kernel storing a value per element of contiguous rows (a norm, a softmax): the
    heuristic's blocks, then the same rows at twice and four times ROW_ELEMENTS_PER_WARP a warp, and one row a program,
    timed on the first CUDA launch without SMELT_AUTOTUNE. No warp count suits them all: on the H100
    and H200, 2048 a warp made BERT's residual + LayerNorm (768 wide, bf16) 6% faster and a LayerNorm's
    forward + backward 7-11% slower (benchmarks/probes/row_warps.py); Inductor's tuner picks one warp a
    row for the first."""
    xn, rn = plan.static_sizes()
    if xn is None or rn is None or not row_tuned(plan, heuristic):
        return [heuristic]
    found = [heuristic]
    for xblock in dict.fromkeys((heuristic.XBLOCK, 1)):
        for per_warp in (ROW_ELEMENTS_PER_WARP, 2 * ROW_ELEMENTS_PER_WARP, 4 * ROW_ELEMENTS_PER_WARP):
            warps = xblock * heuristic.RBLOCK // per_warp
            config = dataclasses.replace(heuristic, XBLOCK=xblock, num_warps=warps)
            if 1 <= warps <= 16 and config not in found:
                found.append(config)
    return found


def row_tuned(plan, heuristic) -> bool:
    """Whether a kernel is one row_candidates times: persistent over contiguous rows longer than
    short ones, storing per element, its blocks from the per-element branch of choose_blocks."""
    return (heuristic.persistent and heuristic.row_split == 1 and heuristic.tiles is None
            and not plan.has_scan and plan.r_contiguous() and plan.stores_per_element()
            and heuristic.RBLOCK is not None and heuristic.RBLOCK > SHORT_ROW)


def _tile_candidates(plan, heuristic) -> list:
    """Other tiles over the heuristic's grid axes, which the source's program ids fix; a tile that
    would need its second axis folded onto the third where the source does not fold is left out."""
    xn, rn = static_int(plan.tiling.outer), static_int(plan.tiling.inner)
    if xn is None or rn is None:
        return [heuristic]
    tiles = heuristic.tiles
    found = [heuristic]
    for x, r, warps in TILE_SHAPES:
        x, r = min(x, next_power_of_2(xn)), min(r, next_power_of_2(rn))
        axes, fold = grid_layout(xn, rn, x, r, tiles.grid_axes[0])
        if axes != tiles.grid_axes or (fold and not tiles.fold_axis1):
            continue
        config = BlockConfig(x, r, warps, False, tiles=TileBlocks(x, r, warps, axes, tiles.fold_axis1))
        if config not in found:
            found.append(config)
    return found


def combo_candidates(heuristic, pointwise_elements: int) -> list:
    """A combo kernel's, timed as a whole: its pointwise kinds' XBLOCK with num_warps, where it has
    pointwise members (the biggest has `pointwise_elements`), else num_warps alone (each reduction
    kind keeps its own blocks)."""
    found = [heuristic]
    if pointwise_elements:
        changes = [dict(XBLOCK=x, num_warps=w) for x, w in ((512, 4), (2048, 4), (2048, 8), (4096, 8), (1024, 8))
                   if x <= next_power_of_2(pointwise_elements)]
    else:
        changes = [dict(num_warps=w) for w in (2, 4, 8, 16)]
    for change in changes:
        config = dataclasses.replace(heuristic, **change)
        if config not in found:
            found.append(config)
    return found
