"""Wall per call of a model suite case on CUDA, for variants of smelt (settings) and Inductor in one
process, timed in alternating rounds of 15 calls (the host's speed drifts between rounds).

    python -m benchmarks.probes.train_wall_ab gpt2 train [smelt,smelt-nopool,inductor]
"""
import sys, time, statistics, torch, smelt
from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs


def main():
    name, mode = sys.argv[1], sys.argv[2]
    variants = {"smelt": ("smelt", {}), "smelt-nopool": ("smelt", {"buffer_pool": False}), "inductor": ("inductor", None)}
    chosen = sys.argv[3].split(",") if len(sys.argv) > 3 else list(variants)
    fns = {}
    for v in chosen:
        backend, settings = variants[v]
        fn = case_callable(all_specs()[name], mode, "real", "cuda", 0, backend)
        if settings is not None:
            with smelt.config.override(**settings):
                for _ in range(3): fn()
        else:
            for _ in range(3): fn()
        torch.cuda.synchronize()
        fns[v] = fn
    rounds = {v: [] for v in fns}
    for r in range(7):
        for v, fn in fns.items():
            torch.cuda.synchronize(); t = time.perf_counter()
            for _ in range(15): fn()
            torch.cuda.synchronize(); rounds[v].append((time.perf_counter() - t) / 15 * 1e3)
    for v, ts in rounds.items():
        print(f"{name} {mode} {v}: wall median {statistics.median(ts):.2f} ms per call (rounds {min(ts):.2f}-{max(ts):.2f})")


if __name__ == "__main__":
    main()
