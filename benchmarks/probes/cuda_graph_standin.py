"""A model-suite case run with smelt's CUDA-graph bookkeeping on the CPU (issue 22): every compiled
graph wrapped in the stand-in of tests/test_cuda_graph_callers.py (an arena for the shared pool,
captures that run the call), so which recording each call replays, when graphs record again and why
(`moved`: an input read in place is elsewhere; `others held`: outputs its capture did not keep off are
held) can be studied without a GPU. Per step, the recordings each graph has made; per refusal for
held outputs, the recordings holding them (cK#i: the i-th recording of the K-th graph made, with the
step it was made in); at the end, each graph's replays, recordings and last refusals.

    python -m benchmarks.probes.cuda_graph_standin whisper --mode train --steps 5 --layers 4 [--amp]
        [--overhead 3]

Graph breaks decide the graphs: Whisper under transformers 5.17 (the GPU machine's) breaks into ten
graphs, under 5.24 into three. To match the GPU machine, install 5.17 beside this one and put it first:
`pip install --no-deps --target /tmp/tf517 transformers==5.17.0 "huggingface-hub>=1.5,<2" httpx`, then
PYTHONPATH=/tmp/tf517:. (the twenty-second session's trace: Whisper's per-layer graphs record 7-8 times
over 4 layers, as on the H200, each graph first recorded while later graphs still warmed up).
"""
from __future__ import annotations

import argparse
import builtins
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))

import test_cuda_graph_callers as standin  # noqa: E402  (the stand-in allocator and capture)

from smelt.runtime import assemble  # noqa: E402
from smelt.tools.model_suite.timing import case_callable  # noqa: E402
from smelt.tools.model_suite.zoo import all_specs  # noqa: E402

ARENA = 1 << 28
made: list = []  # every graphed call, in the order made
born: dict[int, int] = {}  # id(recording) -> the step it was made in
step_now = [0]


class _Recording(standin._RerunRecording):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        born[id(self)] = step_now[0]

    def fits(self, args, held_in) -> bool:
        fits = super().fits(args, held_in)
        if self.refusal == "others held":
            holders = {_label(owner) for block, owner in held_in(self.pool).items()
                       if block not in self.avoided and owner is not self}
            print(f"   step {step_now[0]}: {_label(self)} refused, held: {', '.join(sorted(holders))}")
        return fits


class _Call(standin._CpuGraphedCall):
    recording_type = _Recording
    timed_from = None  # with --overhead: the step from which calls are timed
    seconds: dict = {}  # per graph name: [calls, seconds in the call, seconds running the graph itself]

    def __call__(self, args):
        if self.timed_from is None or step_now[0] < self.timed_from:
            return super().__call__(args)
        record = _Call.seconds.setdefault(self.name, [0, 0.0, 0.0])
        start, record[2] = time.perf_counter(), record[2] - _Call._graph_seconds
        try:
            return super().__call__(args)
        finally:
            record[0] += 1
            record[1] += time.perf_counter() - start
            record[2] += _Call._graph_seconds

    _graph_seconds = 0.0  # running total of the stand-in graphs' own time (their replays)

    def __init__(self, call, name, size_key, mutated, blockers):
        super().__init__(call, name, size_key, mutated, ())  # its CPU tensors stand for CUDA ones
        made.append(self)

    @staticmethod
    def _shared_pool(device):
        if standin._pool is None or not standin._pool.usable:
            standin._pool = standin._ArenaPool(standin._ArenaView(ARENA))
        return standin._pool

    def _static_args(self, inputs, args):
        # The stand-in's capture runs the call, so its copied inputs need the call's values (a real
        # capture runs nothing: the first replay copies them in).
        static = super()._static_args(inputs, args)
        for i in inputs:
            if i is not None and not i.in_place:
                i.copy_in(args[i.position])
        return static




def _label(recording) -> str:
    for k, call in enumerate(made):
        for sizes in call.sizes.values():
            if recording in sizes.recordings:
                return f"c{k}#{sizes.recordings.index(recording)} (step {born.get(id(recording), '?')})"
    return f"a released recording (step {born.get(id(recording), '?')})"


def _graphed_on_the_cpu() -> None:
    def run_wrapper(code, namespace):  # the wrapper's graphs are CPU ones: say they are CUDA's
        builtins.exec(code, namespace)
        namespace["GRAPH_DEVICE_TYPES"] = tuple(namespace["GRAPH_DEVICE_TYPES"]) + ("cuda",)
    assemble.exec = run_wrapper
    assemble.GraphedCall = _Call


def _with_layers(name: str, layers: int) -> None:
    """Every layer count of the model's config set to `layers`."""
    from smelt.tools.model_suite import zoo_text
    config_of = zoo_text.CONFIGS[name]

    def configured(size):
        cls_name, config = config_of(size)
        for field in ("num_hidden_layers", "encoder_layers", "decoder_layers", "n_layer", "num_layers"):
            if hasattr(config, field):
                setattr(config, field, layers)
        return cls_name, config
    zoo_text.CONFIGS[name] = configured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--mode", default="train")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=None, help="a text model's layer count (tiny: 1-2)")
    parser.add_argument("--overhead", type=int, default=None, metavar="STEP",
                        help="from this step on, time each graphed call's bookkeeping (the call less the graph "
                             "it replays: what a replay costs the host on a GPU too), per graph")
    parser.add_argument("--amp", action="store_true",
                        help="train under bfloat16 autocast, as the suite's CUDA training does: a layer's backward "
                             "then gets casts of its weights, not the weights (no parameter tells its callers apart)")
    args = parser.parse_args()
    if args.amp:
        from smelt.tools.model_suite import timing
        timing.autocast_for = lambda device: torch.autocast("cpu", dtype=torch.bfloat16)
    if args.layers is not None:
        _with_layers(args.model, args.layers)
    spec = all_specs()[args.model]
    _graphed_on_the_cpu()
    if args.overhead is not None:
        _Call.timed_from = args.overhead
        replay = standin._Rerun.replay

        def timed_replay(graph):
            start = time.perf_counter()
            try:
                return replay(graph)
            finally:
                _Call._graph_seconds += time.perf_counter() - start
        standin._Rerun.replay = timed_replay
    step = case_callable(spec, args.mode, "tiny", "cpu", 0, "smelt", "reduce-overhead")
    for i in range(args.steps):
        step_now[0] = i
        start = time.perf_counter()
        step()
        print(f"step {i}: {1e3 * (time.perf_counter() - start):.0f} ms; recordings made "
              f"{[c.recorded for c in made]}", flush=True)
    for k, call in enumerate(made):
        recordings = [r for sizes in call.sizes.values() for r in sizes.recordings]
        print(f"c{k} {call.name}: {call.replays} replays, {call.recorded} recordings made, {len(recordings)} kept; "
              f"last refusals {[r.refusal for r in recordings]}")
        copied = {(i.position, i.layout[0], str(i.layout[2]).removeprefix("torch.")) for r in recordings
                  for i in r.copied or ()}
        if copied:  # inputs copied in before each replay: a caller's own tensors, made anew each call
            print(f"   copied inputs (position, size, dtype): {sorted(copied)}")
    steps = args.steps - (args.overhead or 0)
    for name, (calls, total, graph) in _Call.seconds.items():
        print(f"{name}: {calls / steps:.0f} calls a step, bookkeeping {1e6 * (total - graph) / calls:.0f} us a call")
    if _Call.seconds:
        print(f"bookkeeping a step: {1e3 * sum(t - g for _, t, g in _Call.seconds.values()) / steps:.2f} ms")
    if standin._pool is not None:
        print(f"the arena's high mark: {standin._pool.view.high / 2 ** 20:.2f} MiB")


if __name__ == "__main__":
    main()
