"""Host time per call on the CPU: the model zoo's tiny configs (compute negligible), eager, Inductor
and smelt, median of 7 rounds of 50 calls.

    python -m benchmarks.probes.tiny_host_time bert,llama,gpt2 [mode]
"""
import sys, time, statistics, torch
from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs


def main():
    torch.set_num_threads(2)
    for name in sys.argv[1].split(","):
        mode = sys.argv[2] if len(sys.argv) > 2 else "infer_fp32"
        res = {}
        for b in (None, "inductor", "smelt"):
            fn = case_callable(all_specs()[name], mode, "tiny", "cpu", 0, b)
            with torch.no_grad() if mode != "train" else torch.enable_grad():
                for _ in range(3): fn()
                ts = []
                for _ in range(7):
                    t = time.perf_counter()
                    for _ in range(50): fn()
                    ts.append((time.perf_counter() - t) / 50 * 1e6)
            res[b or "eager"] = statistics.median(ts)
        print(name, mode, " ".join(f"{k} {v:.0f} us" for k, v in res.items()))


if __name__ == "__main__":
    main()
