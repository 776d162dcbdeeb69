"""Plain-numpy references for what a converted model must compute: the Hugging Face llama
forward pass on the original (unpermuted) safetensors weights, and the tokenizer.json BPE.
Slow and simple on purpose; they exist to check the converter and the widening kit."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

PathLike = str | os.PathLike[str]


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def hf_llama_forward(config: dict[str, Any], tensors: dict[str, np.ndarray], tokens: Sequence[int]) -> np.ndarray:
    """Logits (n_tokens, n_vocab), float64, of a HF llama state dict on ``tokens`` (causal,
    positions 0..n-1): RMSNorm, RoPE in HF's rotate-half convention, grouped-query attention,
    SwiGLU MLP, final norm and LM head."""
    w = {k: v.astype(np.float64) for k, v in tensors.items()}
    n = len(tokens)
    n_head = config["num_attention_heads"]
    n_head_kv = config.get("num_key_value_heads") or n_head
    head_dim = config.get("head_dim") or config["hidden_size"] // n_head
    eps = config.get("rms_norm_eps", 1e-6)
    theta = config.get("rope_theta", 10000.0)

    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)  # (head_dim/2,)
    angles = np.outer(np.arange(n), inv_freq)  # (n, head_dim/2)
    cos = np.cos(np.concatenate([angles, angles], axis=-1))  # (n, head_dim)
    sin = np.sin(np.concatenate([angles, angles], axis=-1))
    mask = np.triu(np.full((n, n), -np.inf), k=1)  # (n, n): no attending to the future

    h = w["model.embed_tokens.weight"][list(tokens)]  # (n, n_embd)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = _rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(n, n_head, head_dim).transpose(1, 0, 2)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(n, n_head_kv, head_dim).transpose(1, 0, 2)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(n, n_head_kv, head_dim).transpose(1, 0, 2)
        q = q * cos + _rotate_half(q) * sin  # (n_head, n, head_dim)
        k = k * cos + _rotate_half(k) * sin  # (n_head_kv, n, head_dim)
        group = n_head // n_head_kv
        k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(head_dim) + mask  # (n_head, n, n)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        attn = (scores / scores.sum(axis=-1, keepdims=True)) @ v  # (n_head, n, head_dim)
        h = h + attn.transpose(1, 0, 2).reshape(n, n_head * head_dim) @ w[p + "self_attn.o_proj.weight"].T
        x = _rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate = x @ w[p + "mlp.gate_proj.weight"].T
        up = x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return _rms_norm(h, w["model.norm.weight"], eps) @ head.T


def hf_bpe_encode(tokenizer_json: PathLike, text: str, *, add_bos: bool = True) -> list[int]:
    """Token ids the tokenizer.json (SentencePiece-style BPE: "▁" for spaces, one prepended)
    gives ``text``: characters merged pairwise in merge-rank order, unknown characters to
    <unk>, BOS in front."""
    with open(tokenizer_json, encoding="utf-8") as f:
        tok = json.load(f)
    model = tok["model"]
    vocab: dict[str, int] = model["vocab"]
    ranks = {tuple(m.split(" ") if isinstance(m, str) else m): r for r, m in enumerate(model["merges"])}
    symbols = list("▁" + text.replace(" ", "▁"))
    while len(symbols) > 1:
        pairs = [(ranks.get((a, b), len(ranks)), i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))]
        rank, i = min(pairs)
        if rank == len(ranks):
            break
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    unk = vocab[model["unk_token"]]
    ids = [vocab.get(s, unk) for s in symbols]
    return ([1] if add_bos else []) + ids
