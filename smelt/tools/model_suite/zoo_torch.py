"""Attention models built from torch.nn alone: nn.TransformerEncoder, nn.MultiheadAttention
(cross-attention with its own key and value widths) and the encoder-decoder nn.Transformer."""
from __future__ import annotations

import torch
from torch import nn

from .spec import ModelSpec, Sample, register

BATCH = {"tiny": 2, "real": 8}
SEQ = {"tiny": 16, "real": 512}
WIDTH = {"tiny": (32, 2, 64, 2), "real": (512, 8, 2048, 6)}  # d_model, heads, feed-forward, layers


class TransformerEncoder(nn.Module):
    def __init__(self, size):
        super().__init__()
        d, heads, ff, layers = WIDTH[size]
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, activation="gelu")
        # enable_nested_tensor=False: eager's inference fast path would zero the padded rows
        # where a traced run computes them, and the outputs would not be comparable there
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, src, src_key_padding_mask):
        return self.encoder(src, src_key_padding_mask=src_key_padding_mask)


class CrossAttention(nn.Module):
    def __init__(self, size):
        super().__init__()
        d, heads, _, _ = WIDTH[size]
        self.attn = nn.MultiheadAttention(d, heads, kdim=d * 3 // 4, vdim=d // 2, batch_first=True)

    def forward(self, query, key, value, key_padding_mask):
        out, weights = self.attn(query, key, value, key_padding_mask=key_padding_mask)
        return out, weights


class EncoderDecoder(nn.Module):
    def __init__(self, size):
        super().__init__()
        d, heads, ff, layers = WIDTH[size]
        self.transformer = nn.Transformer(d, heads, max(1, layers // 2), max(1, layers // 2), ff, dropout=0.0,
                                          batch_first=True, norm_first=True)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device, dtype=tgt.dtype)
        return self.transformer(src, tgt, tgt_mask=mask, tgt_is_causal=True)


def _padding(batch, seq):
    mask = torch.zeros(batch, seq, dtype=torch.bool)
    mask[-1, seq - seq // 4:] = True
    return mask


def _sample(name):
    def sample(size, seq_len=None, generator=None):
        batch, seq = BATCH[size], seq_len or SEQ[size]
        d = WIDTH[size][0]
        if name == "transformer_encoder":
            return Sample({"src": torch.randn(batch, seq, d, generator=generator), "src_key_padding_mask": _padding(batch, seq)})
        if name == "multihead_attention":
            return Sample({"query": torch.randn(batch, seq // 2, d, generator=generator),
                           "key": torch.randn(batch, seq, d * 3 // 4, generator=generator),
                           "value": torch.randn(batch, seq, d // 2, generator=generator),
                           "key_padding_mask": _padding(batch, seq)})
        return Sample({"src": torch.randn(batch, seq, d, generator=generator),
                       "tgt": torch.randn(batch, seq // 2, d, generator=generator)})
    return sample


def square_loss(model, sample):
    out = model(**sample.kwargs)
    out = out[0] if isinstance(out, tuple) else out
    return out.float().square().mean()


_MODELS = {"transformer_encoder": TransformerEncoder, "multihead_attention": CrossAttention,
           "nn_transformer": EncoderDecoder}
for _name, _cls in _MODELS.items():
    register(ModelSpec(_name, "torch", _cls, _sample(_name), square_loss, requires="torch", default_seq=dict(SEQ)))
