"""First-call seconds of a 4-layer BERT compiled with dynamic=True in a fresh process; run it twice
with one SMELT_CACHE_DIR for cold, then warm (graphs of symbolic sizes in the graph cache).

    SMELT_CACHE_DIR=/tmp/c python -m benchmarks.probes.dynamic_warm   # twice
"""
import time, torch, smelt, transformers
from smelt import graph_cache


def main():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 1000, (4, 128))
    f = torch.compile(model, backend="smelt", dynamic=True)
    t = time.perf_counter()
    with torch.no_grad():
        out = f(input_ids=ids).last_hidden_state
    print(f"first call {time.perf_counter() - t:.2f} s; {dict(graph_cache.stats)}; error {(out - model(input_ids=ids).last_hidden_state).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
