"""Language models from transformers' config classes (random weights, dropout 0, nothing downloaded).

`tiny`: one or two layers, hidden 32, vocabulary 64, batch 2, 16 tokens; each model keeps what
makes it itself (grouped KV heads, a sliding window, partial rotary, experts, relative buckets).
`real`: the published shapes (BERT-base, GPT-2, a Llama of 8 layers at hidden 1024 with 4 KV
heads), batch 8, 512 tokens; vocabularies kept at 32000 at most so the logits fit beside them.
"""
from __future__ import annotations

import torch

from .spec import ModelSpec, Sample, register

BATCH = {"tiny": 2, "real": 8}
SEQ = {"tiny": 16, "real": 512}
TARGET_SEQ = {"tiny": 8, "real": 128}  # decoder side of the encoder-decoders
VOCAB = {"tiny": 64}
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _tf():
    import transformers
    return transformers


# ---------------------------------------------------------------- configs
def _bert_like(cls_name, size, **extra):
    if size == "real":
        return getattr(_tf(), cls_name)(**NO_DROPOUT, **extra)
    tiny = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=40)
    return getattr(_tf(), cls_name)(**dict(tiny, **extra), **NO_DROPOUT)


def _decoder_config(cls_name, size, tiny: dict, real: dict):
    base_tiny = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=4, max_position_embeddings=64)
    base_real = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                     num_attention_heads=16, max_position_embeddings=2048)
    kwargs = dict(base_tiny, **tiny) if size == "tiny" else dict(base_real, **real)
    return getattr(_tf(), cls_name)(**kwargs)


CONFIGS = {
    "bert": lambda s: ("BertForMaskedLM", _bert_like("BertConfig", s)),
    "roberta": lambda s: ("RobertaForMaskedLM", _bert_like(
        "RobertaConfig", s, **(dict(max_position_embeddings=514) if s == "real"  # positions start after padding_idx=1
                                else dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)))),
    "electra": lambda s: ("ElectraForMaskedLM", _bert_like(
        "ElectraConfig", s, **(dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                   intermediate_size=3072, embedding_size=768) if s == "real"
                              else dict(embedding_size=16)))),
    "albert": lambda s: ("AlbertForMaskedLM", _bert_like(
        "AlbertConfig", s, **(dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072) if s == "real"
                              else dict(embedding_size=16, num_hidden_layers=2)))),  # 2 layers: one weight set used twice
    "deberta_v2": lambda s: ("DebertaV2ForMaskedLM", _bert_like(
        "DebertaV2Config", s, relative_attention=True, pos_att_type=["p2c", "c2p"],
        **(dict(vocab_size=32000, position_buckets=256, max_relative_positions=-1, position_biased_input=False,
                norm_rel_ebd="layer_norm", share_att_key=True) if s == "real"
           else dict(position_buckets=8, max_relative_positions=-1, position_biased_input=False,
                     norm_rel_ebd="layer_norm", share_att_key=True)))),
    "distilbert": lambda s: ("DistilBertForMaskedLM", _tf().DistilBertConfig(
        dropout=0.0, attention_dropout=0.0, qa_dropout=0.0, seq_classif_dropout=0.0,
        **({} if s == "real" else dict(vocab_size=64, dim=32, n_layers=1, n_heads=2, hidden_dim=64,
                                       max_position_embeddings=40)))),
    "t5_encoder": lambda s: ("T5EncoderModel", _t5_config(s, feed_forward_proj="gated-gelu")),
    # decoders
    "gpt2": lambda s: ("GPT2LMHeadModel", _tf().GPT2Config(
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        **(dict(n_positions=1024) if s == "real" else dict(vocab_size=64, n_positions=64, n_embd=32, n_layer=1, n_head=2,
                                                      bos_token_id=0, eos_token_id=0)))),
    "llama": lambda s: ("LlamaForCausalLM", _decoder_config(
        "LlamaConfig", s, dict(num_key_value_heads=2), dict(num_key_value_heads=4))),
    "mistral": lambda s: ("MistralForCausalLM", _decoder_config(
        "MistralConfig", s, dict(num_key_value_heads=2, sliding_window=8), dict(num_key_value_heads=4, sliding_window=256))),
    "qwen2": lambda s: ("Qwen2ForCausalLM", _decoder_config(
        "Qwen2Config", s, dict(num_key_value_heads=2), dict(num_key_value_heads=4))),
    "phi": lambda s: ("PhiForCausalLM", _decoder_config(
        "PhiConfig", s, dict(partial_rotary_factor=0.5, resid_pdrop=0.0, embd_pdrop=0.0),
        dict(partial_rotary_factor=0.5, resid_pdrop=0.0, embd_pdrop=0.0))),
    "gemma": lambda s: ("GemmaForCausalLM", _decoder_config(
        "GemmaConfig", s, dict(num_key_value_heads=1, head_dim=8),
        dict(num_attention_heads=8, num_key_value_heads=1, head_dim=128))),
    "mixtral": lambda s: ("MixtralForCausalLM", _decoder_config(
        "MixtralConfig", s, dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
        dict(num_hidden_layers=4, num_key_value_heads=4, intermediate_size=1792, num_local_experts=8,
             num_experts_per_tok=2))),
    "opt": lambda s: ("OPTForCausalLM", _tf().OPTConfig(
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0,
        **({} if s == "real" else dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, ffn_dim=64,
                                       num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=32)))),
    "gpt_neox": lambda s: ("GPTNeoXForCausalLM", _tf().GPTNeoXConfig(
        hidden_dropout=0.0, attention_dropout=0.0, rotary_pct=0.25,
        **(dict(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
           if s == "real" else dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                    intermediate_size=64, max_position_embeddings=64)))),
    # encoder-decoders
    "t5": lambda s: ("T5ForConditionalGeneration", _t5_config(s, feed_forward_proj="relu")),
    "bart": lambda s: ("BartForConditionalGeneration", _tf().BartConfig(
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
        **({} if s == "real" else dict(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1,
                                       encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                       decoder_ffn_dim=64, max_position_embeddings=64)))),
    "whisper": lambda s: ("WhisperForConditionalGeneration", _tf().WhisperConfig(
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
        suppress_tokens=None, begin_suppress_tokens=None,
        **(dict(vocab_size=32000, num_mel_bins=80, d_model=384, encoder_layers=4, decoder_layers=4,
                encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536,
                max_source_positions=1500, max_target_positions=448, pad_token_id=31999, bos_token_id=31998,
                eos_token_id=31999, decoder_start_token_id=31998) if s == "real"
           else dict(vocab_size=64, num_mel_bins=8, d_model=32, encoder_layers=1, decoder_layers=1,
                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                     max_source_positions=8, max_target_positions=16, pad_token_id=63, bos_token_id=62,
                     eos_token_id=63, decoder_start_token_id=62)))),
}


def _t5_config(size, feed_forward_proj):
    if size == "real":  # t5-small
        return _tf().T5Config(vocab_size=32000, dropout_rate=0.0, feed_forward_proj=feed_forward_proj)
    return _tf().T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1,
                          num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                          dropout_rate=0.0, feed_forward_proj=feed_forward_proj, decoder_start_token_id=0)


FAMILY = {
    "bert": "encoder", "roberta": "encoder", "electra": "encoder", "albert": "encoder", "deberta_v2": "encoder",
    "distilbert": "encoder", "t5_encoder": "encoder",
    "gpt2": "decoder", "llama": "decoder", "mistral": "decoder", "qwen2": "decoder", "phi": "decoder",
    "gemma": "decoder", "mixtral": "decoder", "opt": "decoder", "gpt_neox": "decoder",
    "t5": "seq2seq", "bart": "seq2seq", "whisper": "seq2seq",
}


# ---------------------------------------------------------------- models and inputs
def _builder(name):
    def build(size):
        cls_name, config = CONFIGS[name](size)
        config._attn_implementation = "sdpa" if name not in ("albert", "deberta_v2") else "eager"
        if name == "mixtral":
            # the per-expert loop (routing by index, index_add_): the grouped matmul transformers 5
            # picks by default has no float64 kernel, so the reference could not run
            config._experts_implementation = "eager"
        return getattr(_tf(), cls_name)(config)
    return build


def _vocab(name, size):
    return VOCAB.get(size) or CONFIGS[name](size)[1].vocab_size


def _first_token(name):
    # ids below this are special (padding, start, end) in the models that give them meaning
    return 4 if name in ("roberta", "bart") else 1


def _text_sample(name, family):
    def sample(size, seq_len=None, generator=None):
        batch, seq = BATCH[size], seq_len or SEQ[size]
        vocab = _vocab(name, size)
        low = _first_token(name)
        ids = torch.randint(low, vocab - 2, (batch, seq), generator=generator)
        if family == "encoder":
            mask = torch.ones(batch, seq, dtype=torch.long)
            mask[-1, seq - seq // 4:] = 0  # the last row is padded: the attention mask's path runs
            return Sample({"input_ids": ids, "attention_mask": mask}, ids.clone())
        if family == "decoder":  # the decode mode turns the cache on
            return Sample({"input_ids": ids, "use_cache": False}, ids.clone())
        target = torch.randint(low, vocab - 2, (batch, TARGET_SEQ[size] if seq_len is None else max(2, seq // 2)),
                               generator=generator)
        if name == "whisper":
            cfg = CONFIGS[name](size)[1]
            features = torch.randn(batch, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=generator)
            return Sample({"input_features": features, "decoder_input_ids": target, "use_cache": False}, target)
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[-1, seq - seq // 4:] = 0
        return Sample({"input_ids": ids, "attention_mask": mask, "decoder_input_ids": target, "use_cache": False}, target)
    return sample


def text_loss(model, sample: Sample) -> torch.Tensor:
    if isinstance(model, _tf().T5EncoderModel):
        return model(**sample.kwargs).last_hidden_state.float().square().mean()
    return model(**sample.kwargs, labels=sample.labels).loss


for _name, _family in FAMILY.items():
    register(ModelSpec(_name, _family, _builder(_name), _text_sample(_name, _family), text_loss,
                       requires="transformers", default_seq=dict(SEQ)))
