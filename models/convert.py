"""Convert a Hugging Face llama checkpoint (safetensors + config.json + tokenizer.json) to GGUF.

Read with plain numpy (a safetensors file is an 8-byte header length, a JSON header and raw
little-endian arrays) and written with the ``gguf`` package. Three details decide whether
llama.cpp computes what the checkpoint computes:

- Rotary layout. HF llama rotates the halves of each head (``rotate_half``: dims i and
  i + head_dim/2 form a pair); llama.cpp rotates adjacent dims (2i, 2i+1). The rows of
  ``q_proj`` and ``k_proj`` are permuted per head so that pair i lands on rows 2i, 2i+1
  (``k_proj`` with the KV head count). Attention scores are unchanged by the permutation
  because q and k move together; v and o are left alone.
- Tokenizer. A "SentencePiece-style" BPE tokenizer.json (a normalizer that prepends "▁" and
  turns spaces into "▁", no pre-tokenizer, merges that cross word boundaries, byte fallback)
  is written as llama.cpp's ``llama`` (SPM) tokenizer with a space prefix, and each merged
  token scored by minus its merge rank, so llama.cpp's highest-score-first merging replays
  the merge list. A byte-level BPE tokenizer.json (GPT-2 style, "Ġ" for spaces) is written
  as ``gpt2`` with its merges.
- Norms and rope: ``rms_norm_eps`` and ``rope_theta`` come from config.json; tied
  embeddings (``tie_word_embeddings``) write no ``output.weight`` (llama.cpp reuses
  ``token_embd``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from fly_cpp.models import make

from fly_cpp.basics.errors import FlyError

PathLike = str | os.PathLike[str]

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
              "BF16": np.uint16}


def read_safetensors(path: PathLike) -> dict[str, np.ndarray]:
    """All tensors of a .safetensors file as numpy arrays (BF16 widened to float32)."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise FlyError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        arr = np.frombuffer(data, dtype=dtype, count=(end - start) // np.dtype(dtype).itemsize, offset=base + start)
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr.reshape(info["shape"])
    return out


def load_checkpoint(src: PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config, tensors) of a Hugging Face checkpoint directory (one or more safetensors files)."""
    src = Path(src)
    config_path = src / "config.json"
    if not config_path.exists():
        raise FlyError(f"{src} has no config.json: not a Hugging Face checkpoint")
    config = json.loads(config_path.read_text())
    if config.get("model_type") != "llama":
        raise FlyError(f"{src}: model_type {config.get('model_type')!r} is not supported (llama only)")
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise FlyError(f"{src} has no .safetensors files")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        tensors.update(read_safetensors(f))
    if "lm_head.weight" in tensors and "model.embed_tokens.weight" not in tensors:
        tensors["model.embed_tokens.weight"] = tensors["lm_head.weight"]  # stored once when tied
    return config, tensors


def permute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a q/k projection from HF's rotate-half layout to llama.cpp's adjacent pairs.
    w: (n_head * head_dim, n_embd)."""
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# --- tokenizer ---------------------------------------------------------------------------

def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE vocabularies use it)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


def _is_spm_style(tok: dict[str, Any]) -> bool:
    normalizers = (tok.get("normalizer") or {}).get("normalizers", [tok.get("normalizer") or {}])
    return any(n.get("type") == "Prepend" and n.get("prepend") == "▁" for n in normalizers) or \
        any(n.get("type") == "Replace" and n.get("content") == "▁" for n in normalizers)


def tokenizer_fields(src: PathLike, config: dict[str, Any]) -> dict[str, Any]:
    """The GGUF tokenizer fields for the tokenizer.json in ``src``."""
    src = Path(src)
    path = src / "tokenizer.json"
    if not path.exists():
        raise FlyError(f"{src} has no tokenizer.json")
    tok = json.loads(path.read_text(encoding="utf-8"))
    model = tok["model"]
    if model.get("type") != "BPE":
        raise FlyError(f"{path}: tokenizer model {model.get('type')!r} is not supported (BPE only)")
    tok_config_path = src / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text()) if tok_config_path.exists() else {}

    vocab: dict[str, int] = dict(model["vocab"])
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    n_vocab = max(config.get("vocab_size", 0), max(vocab.values()) + 1)
    texts = [f"[PAD{i}]" for i in range(n_vocab)]
    for text, i in vocab.items():
        texts[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]

    known = set(vocab.values())
    special = {a["id"] for a in tok.get("added_tokens", []) if a.get("special")}
    unk = vocab.get(model.get("unk_token") or "", None)
    types = []
    for i, text in enumerate(texts):
        if i == unk:
            types.append(gguf.TokenType.UNKNOWN)
        elif i in special:
            types.append(gguf.TokenType.CONTROL)
        elif i not in known:
            types.append(gguf.TokenType.UNUSED)
        elif len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)

    fields: dict[str, Any] = {"tokens": texts, "types": types}
    if _is_spm_style(tok):
        # Score merged tokens by minus their merge rank (earlier merges win); single
        # characters and specials never compete, so their score does not matter.
        scores = [0.0] * n_vocab
        for rank, merge in enumerate(merges):
            merged = vocab.get(merge.replace(" ", ""))
            if merged is not None and scores[merged] == 0.0:
                scores[merged] = -float(rank + 1)
        fields.update(model="llama", pre="default", scores=scores, add_space_prefix=True)
    else:
        fields.update(model="gpt2", pre="default", merges=merges)

    def token_id(key: str) -> int | None:
        value = tok_config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str) and value in vocab:
            return vocab[value]
        return None

    fields["bos"] = token_id("bos_token") if token_id("bos_token") is not None else config.get("bos_token_id")
    fields["eos"] = token_id("eos_token") if token_id("eos_token") is not None else config.get("eos_token_id")
    fields["unk"] = unk
    fields["pad"] = token_id("pad_token")
    fields["add_bos"] = bool(tok_config.get("add_bos_token", True))
    fields["add_eos"] = bool(tok_config.get("add_eos_token", False))
    if tok_config.get("chat_template"):
        fields["chat_template"] = tok_config["chat_template"]
    return fields


def add_tokenizer(writer: gguf.GGUFWriter, fields: dict[str, Any]) -> None:
    writer.add_tokenizer_model(fields["model"])
    writer.add_tokenizer_pre(fields["pre"])
    writer.add_token_list(fields["tokens"])
    writer.add_token_types(fields["types"])
    if "scores" in fields:
        writer.add_token_scores(fields["scores"])
    if "merges" in fields:
        writer.add_token_merges(fields["merges"])
    if "add_space_prefix" in fields:
        writer.add_add_space_prefix(fields["add_space_prefix"])
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                     ("unk", writer.add_unk_token_id), ("pad", writer.add_pad_token_id)):
        if fields.get(key) is not None:
            add(fields[key])
    writer.add_add_bos_token(fields["add_bos"])
    writer.add_add_eos_token(fields["add_eos"])
    if fields.get("chat_template"):
        writer.add_chat_template(fields["chat_template"])


# --- weights -----------------------------------------------------------------------------

def gguf_tensors(config: dict[str, Any], tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The llama.cpp tensors (name -> float32 array) of a HF llama state dict."""
    n_head = config["num_attention_heads"]
    n_head_kv = config.get("num_key_value_heads") or n_head
    out = {"token_embd.weight": tensors["model.embed_tokens.weight"],
           "output_norm.weight": tensors["model.norm.weight"]}
    if not config.get("tie_word_embeddings", False):
        out["output.weight"] = tensors["lm_head.weight"]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({
            f"blk.{i}.attn_norm.weight": tensors[p + "input_layernorm.weight"],
            f"blk.{i}.attn_q.weight": permute_rotary(tensors[p + "self_attn.q_proj.weight"], n_head),
            f"blk.{i}.attn_k.weight": permute_rotary(tensors[p + "self_attn.k_proj.weight"], n_head_kv),
            f"blk.{i}.attn_v.weight": tensors[p + "self_attn.v_proj.weight"],
            f"blk.{i}.attn_output.weight": tensors[p + "self_attn.o_proj.weight"],
            f"blk.{i}.ffn_norm.weight": tensors[p + "post_attention_layernorm.weight"],
            f"blk.{i}.ffn_gate.weight": tensors[p + "mlp.gate_proj.weight"],
            f"blk.{i}.ffn_up.weight": tensors[p + "mlp.up_proj.weight"],
            f"blk.{i}.ffn_down.weight": tensors[p + "mlp.down_proj.weight"],
        })
    return {k: np.asarray(v, dtype=np.float32) for k, v in out.items()}


def write_llama(out: PathLike, hparams: dict[str, Any], tokenizer: dict[str, Any], tensors: dict[str, np.ndarray],
                *, name: str, dtype: str = "f32", extra: dict[str, str] | None = None) -> Path:
    """Write a llama GGUF. hparams: n_ctx, n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim,
    rope_theta, rms_eps. Matrices are stored as ``dtype`` (f32/f16), vectors as f32."""
    writer = llama_writer(out, hparams, tokenizer, name=name, dtype=dtype, extra=extra)
    for tname, arr in tensors.items():
        store = np.float16 if dtype == "f16" and arr.ndim == 2 else np.float32
        writer.add_tensor(tname, np.ascontiguousarray(arr, dtype=store))
    make._write(writer)
    return Path(out)


def llama_writer(out: PathLike, hparams: dict[str, Any], tokenizer: dict[str, Any], *, name: str,
                 dtype: str = "f32", extra: dict[str, str] | None = None) -> gguf.GGUFWriter:
    """A GGUF writer for a llama, its metadata added (``write_llama``'s), no tensors yet."""
    if dtype not in ("f32", "f16"):
        raise FlyError(f"dtype must be f32 or f16, got {dtype!r}")
    writer = gguf.GGUFWriter(str(out), arch="llama")
    writer.add_name(name)
    for key, value in (extra or {}).items():
        writer.add_string(key, value)
    writer.add_context_length(hparams["n_ctx"])
    writer.add_embedding_length(hparams["n_embd"])
    writer.add_block_count(hparams["n_layer"])
    writer.add_feed_forward_length(hparams["n_ff"])
    writer.add_head_count(hparams["n_head"])
    writer.add_head_count_kv(hparams["n_head_kv"])
    writer.add_rope_dimension_count(hparams["head_dim"])
    if hparams["head_dim"] * hparams["n_head"] != hparams["n_embd"]:
        writer.add_key_length(hparams["head_dim"])
        writer.add_value_length(hparams["head_dim"])
    writer.add_rope_freq_base(float(hparams["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(hparams["rms_eps"]))
    writer.add_vocab_size(len(tokenizer["tokens"]))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    add_tokenizer(writer, tokenizer)
    return writer


def hparams_of(config: dict[str, Any]) -> dict[str, Any]:
    n_head = config["num_attention_heads"]
    return {
        "n_ctx": config.get("max_position_embeddings", 2048),
        "n_embd": config["hidden_size"],
        "n_layer": config["num_hidden_layers"],
        "n_ff": config["intermediate_size"],
        "n_head": n_head,
        "n_head_kv": config.get("num_key_value_heads") or n_head,
        "head_dim": config.get("head_dim") or config["hidden_size"] // n_head,
        "rope_theta": config.get("rope_theta", 10000.0),
        "rms_eps": config.get("rms_norm_eps", 1e-6),
    }


def convert_hf_llama(src: PathLike, out: PathLike, *, dtype: str = "f32", name: str | None = None) -> Path:
    """Convert the Hugging Face llama checkpoint directory ``src`` to the GGUF file ``out``."""
    config, tensors = load_checkpoint(src)
    if config.get("rope_scaling"):
        raise FlyError(f"{src}: rope_scaling {config['rope_scaling']!r} is not supported")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise FlyError(f"{src}: llama checkpoints with biases are not supported")
    return write_llama(out, hparams_of(config), tokenizer_fields(src, config), gguf_tensors(config, tensors),
                       name=name or Path(src).resolve().name, dtype=dtype)
