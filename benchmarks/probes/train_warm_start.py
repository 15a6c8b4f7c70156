"""A training step's first call in fresh processes (issue 24: warm <= Dynamo's trace + 1 s): GPT-2
(small config, dropout off, batch 1 x 16 tokens) under backend eager (Dynamo alone), aot_eager
(Dynamo and AOTAutograd), then smelt cold and twice warm, all sharing one new cache folder.

    python -m benchmarks.probes.train_warm_start [--layers 4]
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = r"""
import sys, time, torch, transformers
backend, layers = sys.argv[1], int(sys.argv[2])
import smelt  # noqa: F401  (in every child: its import-time settings change Dynamo's own speed)
cfg = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, n_layer=layers)
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(cfg).train()
ids = torch.randint(0, 50000, (1, 16))
step = torch.compile(lambda i: model(input_ids=i, labels=i).loss, backend=backend)
start = time.perf_counter()
step(ids).backward()
print(f"{time.perf_counter() - start:.2f}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="smelt_warm_train_") as cache:
        env = dict(os.environ, SMELT_CACHE_DIR=cache, PYTHONPATH=ROOT)
        print("| run | first step s |\n| --- | --- |")
        for label, backend in [("Dynamo alone (eager)", "eager"), ("aot_eager", "aot_eager"), ("smelt, cold", "smelt"),
                               ("smelt, warm", "smelt"), ("smelt, warm again", "smelt")]:
            done = subprocess.run([sys.executable, "-c", CHILD, backend, str(args.layers)], env=env, cwd=ROOT,
                                  capture_output=True, text=True, check=True)
            print(f"| {label} | {done.stdout.split()[-1]} |", flush=True)


if __name__ == "__main__":
    main()
