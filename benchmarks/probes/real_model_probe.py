"""Where a real model goes wrong under smelt: cosine of outputs (inference) or parameter gradients
(training) to eager's, over variants of one model (layers, dtype, sequence length), so the smallest
failing variant can be dumped with SMELT_DEBUG_DIR and read.

    python -m benchmarks.probes.real_model_probe llama --layers 1 2 8 --dtype bfloat16 float32
    python -m benchmarks.probes.real_model_probe gpt2 --train
"""
from __future__ import annotations

import argparse
import time

import torch

import smelt  # noqa: F401


def build(name: str, layers: int, hidden: int):
    import transformers as tf
    if name == "llama":
        cfg = tf.LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                             num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                             max_position_embeddings=2048)
        return tf.LlamaForCausalLM(cfg)
    if name == "gpt2":
        cfg = tf.GPT2Config(n_layer=layers, n_embd=hidden, n_head=12, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return tf.GPT2LMHeadModel(cfg)
    raise SystemExit(f"unknown model {name}")


def cosine(a, b):
    a, b = a.float().flatten(), b.float().flatten()
    return (a @ b / (a.norm() * b.norm() + 1e-30)).item()


def run(name, layers, dtype, batch, seq, train, hidden, backend):
    torch.manual_seed(0)
    model = build(name, layers, hidden).cuda()
    if not train:
        model = model.to(dtype).eval()
    ids = torch.randint(0, 1000, (batch, seq), device="cuda")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    if not train:
        with torch.no_grad():
            expected = model(ids).logits
            t0 = time.time()
            actual = compiled(ids).logits
            return {"out_cos": cosine(actual, expected), "max_abs": (actual.float() - expected.float()).abs().max().item(),
                    "compile_s": time.time() - t0}

    def grads(m):
        m.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    loss_e, g_e = grads(model)
    t0 = time.time()
    loss_a, g_a = grads(compiled)
    worst = sorted((cosine(g_a[n], g_e[n]), n) for n in g_e if n in g_a)[:4]
    return {"loss": (loss_a.item(), loss_e.item()), "worst_grad_cos": worst, "compile_s": time.time() - t0,
            "missing": [n for n in g_e if n not in g_a]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--layers", type=int, nargs="+", default=[8])
    p.add_argument("--dtype", nargs="+", default=["bfloat16"])
    p.add_argument("--seq", type=int, nargs="+", default=[512])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--train", action="store_true")
    p.add_argument("--backend", default="smelt")
    args = p.parse_args()
    for layers in args.layers:
        for dt in args.dtype:
            for seq in args.seq:
                r = run(args.model, layers, getattr(torch, dt), args.batch, seq, args.train, args.hidden, args.backend)
                print(f"{args.model} layers={layers} dtype={dt} seq={seq} train={args.train} {args.backend}: {r}",
                      flush=True)


if __name__ == "__main__":
    main()
