"""Allocations a training step's wrappers make, with and without the buffer pool (scheduler/pool.py):
a 12-layer GPT-2 at small widths on the CPU, its gradients checked against eager, each graph's
allocations, buffers taken from dead ones, in-place reuses and planned peak.

    SMELT_GRAPH_CACHE=0 SMELT_BUFFER_POOL=0|1 python -m benchmarks.probes.buffer_pool_count [layers]
"""
import re, sys, torch, transformers, smelt, smelt.observe


def main():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=64, n_embd=64, n_layer=int(sys.argv[1]) if len(sys.argv) > 1 else 12,
                                  n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 64, (2, 16))
    ref = transformers.GPT2LMHeadModel(cfg); ref.load_state_dict(model.state_dict())
    f = torch.compile(lambda m: m(input_ids=ids, labels=ids).loss, backend="smelt")
    loss = f(model); loss.backward()
    rl = ref(input_ids=ids, labels=ids).loss; rl.backward()
    err = max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
    print("loss", loss.item(), rl.item(), "max grad diff", err)
    for g in smelt.observe.compiled_graphs():
        src = g.wrapper_source
        print(g.kind, len(g.kernel_names), "kernels; allocations:", len(re.findall(r"empty_strided", src)),
              "taken:", src.count("memory"), "in place:", src.count("written over"), re.search(r"PLANNED_PEAK_BYTES = (\w+)", src).group(1))


if __name__ == "__main__":
    main()
