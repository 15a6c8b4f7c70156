"""Small models on the CPU (issue 23): eager, Inductor's C++ backend and smelt, fp32 inference.

    make bench-cpu-models                  # or: python -m benchmarks.cpu_models [--only bert,llama] [--no-compile-time]
    python -m benchmarks.cpu_models --frozen --no-compile-time   # also smelt with SMELT_FREEZE_WEIGHTS (opt-in)

Steady time: the median of 15 calls after 3, all three in one process, their calls interleaved
(torch's threads as set: OMP_NUM_THREADS / --threads). Compile time: the first call in a fresh process, less an eager call
(benchmarks/compile_time.py), cold (brand-new cache dirs) then warm (the same dirs again).
"""
from __future__ import annotations

import argparse
import math

import torch

# name -> (what it is, for the table)
MODELS = {
    "resnet18": "timm resnet18, batch 4, 224x224",
    "mobilenetv3": "timm mobilenetv3_small_100, batch 4, 224x224",
    "bert": "BERT 4 layers, hidden 256, batch 4, seq 128",
    "llama": "Llama 4 layers, hidden 256, 2 KV heads, batch 4, seq 128",
}


def build(name: str):
    """(model in eval mode, its inputs), seeded."""
    torch.manual_seed(0)
    if name in ("bert", "llama"):
        import transformers as tf
        if name == "bert":
            cfg = tf.BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
            model = tf.BertModel(cfg)
        else:
            cfg = tf.LlamaConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=688, vocab_size=32000)
            model = tf.LlamaModel(cfg)
        return model.eval(), (torch.randint(0, 1000, (4, 128)),)
    if name in ("resnet18", "mobilenetv3"):
        from smelt.tools.model_suite.torchvision_stub import install_if_missing
        install_if_missing()  # timm imports torchvision, which cannot be installed beside this torch
        import timm
        model = timm.create_model("resnet18" if name == "resnet18" else "mobilenetv3_small_100")
        return model.eval(), (torch.randn(4, 3, 224, 224),)
    raise SystemExit(f"unknown model {name}; known: {', '.join(MODELS)}")


def inference(name: str):
    """(model, a function running it under no_grad, its inputs): what compile_time's child compiles."""
    model, inputs = build(name)

    def forward(*args):
        with torch.no_grad():
            return model(*args)
    return model, forward, inputs


CALLS = 15


def _steady(name: str, frozen: bool = False) -> list[float]:
    """Median ms of eager, Inductor and smelt (and smelt with frozen weights), their calls
    interleaved one by one: this shared machine's speed drifts by 10-60% within minutes, and each
    backend then sees the same drift."""
    import statistics
    import time
    torch._dynamo.reset()
    model, inputs = build(name)
    fns = [model, torch.compile(model, backend="inductor"), torch.compile(model, backend="smelt")]
    if frozen:
        fns.append(torch.compile(model, backend="smelt", options={"freeze_weights": True}))
    times = [[] for _ in fns]
    with torch.no_grad():
        for fn in fns:
            for _ in range(3):
                fn(*inputs)
        for _ in range(CALLS):
            for fn, kept in zip(fns, times):
                start = time.perf_counter()
                fn(*inputs)
                kept.append(time.perf_counter() - start)
    return [statistics.median(t) * 1e3 for t in times]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument("--no-compile-time", action="store_true")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--frozen", action="store_true", help="also smelt with frozen weights (SMELT_FREEZE_WEIGHTS)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.only.split(",") if args.only else list(MODELS)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    rows, ratios = [], {"eager": [], "inductor": [], "frozen": []}
    for name in names:
        eager, inductor, smelt, *frozen = _steady(name, args.frozen)
        compile_cells = "| — / — | — / — "
        if not args.no_compile_time:
            from benchmarks.compile_time import cold_and_warm
            cells = [cold_and_warm(b, f"model:{name}", "cpu", False, timeout=600) for b in ("inductor", "smelt")]
            fmt = [[f"{v:.1f}" if isinstance(v, float) else v for v in c] for c in cells]
            compile_cells = f"| {fmt[0][0]} / {fmt[1][0]} | {fmt[0][1]} / {fmt[1][1]} "
        ratios["eager"].append(eager / smelt)
        ratios["inductor"].append(inductor / smelt)
        frozen_cells = ""
        if frozen:
            ratios["frozen"].append(inductor / frozen[0])
            frozen_cells = f"| {frozen[0]:.2f} | {inductor / frozen[0]:.2f}x "
        rows.append(f"| {name} ({MODELS[name]}) | {eager:.2f} | {inductor:.2f} | {smelt:.2f} | {eager / smelt:.2f}x "
                    f"| {inductor / smelt:.2f}x {frozen_cells}{compile_cells}|")
        print(f"{name}: eager {eager:.2f} ms, inductor {inductor:.2f} ms, smelt {smelt:.2f} ms"
              + (f", smelt with frozen weights {frozen[0]:.2f} ms" if frozen else ""), flush=True)
    frozen_head = "| smelt, frozen weights, ms | frozen vs Inductor " if args.frozen else ""
    print("\n| model | eager ms | Inductor ms | smelt ms | smelt vs eager | smelt vs Inductor " + frozen_head +
          "| cold compile s (Inductor / smelt) | warm compile s (Inductor / smelt) |")
    print("|---|---|---|---|---|---|---|---|" + ("---|---|" if args.frozen else ""))
    print("\n".join(rows))
    geo = {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in ratios.items() if v}
    print(f"\nGeometric mean: smelt {geo['eager']:.2f}x eager, {geo['inductor']:.2f}x Inductor over {len(rows)} models"
          + (f"; with frozen weights {geo['frozen']:.2f}x Inductor" if "frozen" in geo else ""))


if __name__ == "__main__":
    main()
