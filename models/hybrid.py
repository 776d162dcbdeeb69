"""Synthetic hybrid models: random-weight ``qwen35`` GGUFs (Gated DeltaNet + full attention, the
layout of Qwen3.5 / Qwen3.6) on a real vocabulary, for correctness and cost tests, not quality.

Every ``full_attention_interval``-th layer is full attention (gated queries, q/k norms, partial
multi-section rotary embedding), the others Gated DeltaNet layers (a causal convolution over
q/k/v, then the delta rule on a per-head recurrent state): the tensors, shapes and metadata of
llama.cpp's ``qwen35`` loader. llama.cpp refuses a ``qwen35`` model without an attention layer,
so a model has at least ``full_attention_interval`` layers.

Embeddings are tied (no ``output.weight``: llama.cpp reads the head from ``token_embd``), which
keeps a 152k-token vocabulary small. A tied head would score the input token far above all
others (the residual stream carries its embedding); the final norm's weight is a balanced
pattern of +g and -g, under which a token's own embedding scores zero on average, so the
logits spread over a few nats (``logit_scale``) around varied choices.

The layers a draft cut from the model (``make.cut_layers``) leaves out add to the residual
stream with the gain ``tail_gain``: the smaller it is, the more often the draft (the first
``n_layer`` of these layers) picks the target's greedy token.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from fly_cpp.models import make

from fly_cpp.basics.errors import FlyError

PathLike = str | os.PathLike[str]
SYNTHETIC_KEY = "fly_cpp.synthetic"
_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class Shape:
    """A ``qwen35`` model's sizes. DeltaNet layers: ``ssm_heads`` value heads of ``ssm_head``
    dims (keys and values alike), ``ssm_groups`` key heads, a ``conv`` tap convolution;
    attention layers: ``n_head`` query heads of ``head_dim`` dims over ``n_head_kv`` KV heads."""

    n_embd: int = 32
    n_layer: int = 8
    n_ff: int = 64
    n_head: int = 2
    n_head_kv: int = 1
    head_dim: int = 16
    ssm_heads: int = 2
    ssm_groups: int = 2
    ssm_head: int = 16
    conv: int = 4
    interval: int = 4  # every interval-th layer is full attention
    n_ctx: int = 4096
    dtype: str = "f32"  # of the weight matrices ("f32", "f16"); norms and vectors stay f32
    embd_dtype: str = "q8_0"  # of the token embeddings (also the output head): "q4_0", "q8_0", "f16", "f32"
    logit_scale: float = 8.0
    tail_gain: float = 0.2  # output gain of the layers past ``draft_layers``
    draft_layers: int = 4
    seed: int = 0
    mtp: int = 0  # MTP ("nextn") layers after the trunk: 0, or 1 as Qwen3.5/3.6 ship


# the kit's pairs (kit.py): a tiny one for tests, and one whose decode costs what memory-bound
# hybrids' do on a CPU (F16 layers that the 152k-token head does not dwarf), for speed
TINY = Shape()
TINY_MTP = Shape(mtp=1)  # qwen35-tiny with an MTP head: the same trunk (same seed), one nextn layer after it
COSTLY = Shape(n_embd=256, n_layer=24, n_ff=2048, n_head=4, n_head_kv=2, head_dim=64, ssm_heads=4, ssm_groups=2,
               ssm_head=64, dtype="f16", embd_dtype="q4_0", tail_gain=0.1, seed=1)


def random_qwen35(vocab: PathLike, out: PathLike, shape: Shape = Shape(), *, layers: int | None = None,
                  name: str = "") -> Path:
    """Write a random-weight ``qwen35`` GGUF with the tokenizer of ``vocab`` (a vocab-only GGUF,
    e.g. llama.cpp's ggml-vocab-qwen35.gguf), labelled synthetic. ``layers``: keep only the
    first so many of ``shape``'s layers (a draft: the same tensors ``make.cut_layers`` would keep)."""
    s = shape
    n_layer = s.n_layer if layers is None else layers
    if not s.interval <= n_layer <= s.n_layer:
        raise FlyError(f"a qwen35 model needs a full-attention layer (every {s.interval}th layer is one): "
                       f"keep {s.interval} to {s.n_layer} layers, not {n_layer}")
    if s.ssm_heads % s.ssm_groups or s.n_head % s.n_head_kv:
        raise FlyError("value heads must be a multiple of key heads (DeltaNet and attention alike)")
    tokenizer = make.tokenizer_fields(vocab)
    if "tokenizer.ggml.tokens" not in tokenizer:
        raise FlyError(f"{vocab} has no tokenizer.ggml.tokens: not a vocabulary GGUF")
    if s.mtp not in (0, 1):
        raise FlyError(f"llama.cpp's qwen35 runs one MTP layer, not {s.mtp}")
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"][0])  # type: ignore[arg-type]
    label = name or f"qwen35-random-{s.n_embd}x{n_layer}"
    mtp = s.mtp if layers is None else 0  # a draft cut from the trunk has no MTP head
    tensors = _tensors(s, n_vocab)
    if mtp:
        tensors += _mtp_tensors(s, tensors)
    _write(out, s, n_layer, tokenizer, tensors, f"{label} (synthetic)", mtp)
    return Path(out)


Tensor = tuple[str, np.ndarray, "gguf.GGMLQuantizationType | None"]


def _tensors(s: Shape, n_vocab: int) -> list[Tensor]:
    rng = np.random.default_rng(s.seed)
    wtype = {"f32": np.float32, "f16": np.float16}[s.dtype]
    key_dim, value_dim = s.ssm_head * s.ssm_groups, s.ssm_head * s.ssm_heads
    out: list[Tensor] = []

    def mat(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:  # (rows, cols): ggml's {cols, rows}
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(wtype)

    def vec(n: int, value: float = 1.0) -> np.ndarray:
        return np.full(n, value, dtype=np.float32)

    def add(name: str, data: np.ndarray, qtype: gguf.GGMLQuantizationType | None = None) -> None:
        out.append((name, data, qtype))

    embd = rng.standard_normal((n_vocab, s.n_embd)).astype(np.float32)
    if s.embd_dtype in ("q4_0", "q8_0"):
        qtype = gguf.GGMLQuantizationType[s.embd_dtype.upper()]
        add("token_embd.weight", gguf.quants.quantize(embd, qtype), qtype)
    else:
        add("token_embd.weight", embd.astype({"f16": np.float16, "f32": np.float32}[s.embd_dtype]))
    signs = np.where(np.arange(s.n_embd) % 2 == 0, 1.0, -1.0)[rng.permutation(s.n_embd)]
    add("output_norm.weight", (signs * s.logit_scale / np.sqrt(s.n_embd)).astype(np.float32))
    for i in range(s.n_layer):
        gain = 1.0 if i < s.draft_layers else s.tail_gain
        p = f"blk.{i}."
        add(p + "attn_norm.weight", vec(s.n_embd))
        add(p + "post_attention_norm.weight", vec(s.n_embd))
        if (i + 1) % s.interval == 0:  # full attention: queries carry their output gate, head by head
            add(p + "attn_q.weight", mat(2 * s.n_head * s.head_dim, s.n_embd))
            add(p + "attn_k.weight", mat(s.n_head_kv * s.head_dim, s.n_embd))
            add(p + "attn_v.weight", mat(s.n_head_kv * s.head_dim, s.n_embd))
            add(p + "attn_output.weight", mat(s.n_embd, s.n_head * s.head_dim, 0.5 * gain))
            add(p + "attn_q_norm.weight", vec(s.head_dim))
            add(p + "attn_k_norm.weight", vec(s.head_dim))
        else:  # Gated DeltaNet
            add(p + "attn_qkv.weight", mat(2 * key_dim + value_dim, s.n_embd))
            add(p + "attn_gate.weight", mat(value_dim, s.n_embd))
            add(p + "ssm_conv1d.weight",
                (rng.standard_normal((2 * key_dim + value_dim, s.conv)) / np.sqrt(s.conv)).astype(np.float32))
            add(p + "ssm_dt.bias", vec(s.ssm_heads, 0.0))
            # A = -exp(A_log): per-head decay rates from fast to slow, as trained models have
            add(p + "ssm_a", -np.exp(rng.uniform(-2.0, 0.5, s.ssm_heads)).astype(np.float32))
            add(p + "ssm_beta.weight", mat(s.ssm_heads, s.n_embd))
            add(p + "ssm_alpha.weight", mat(s.ssm_heads, s.n_embd))
            add(p + "ssm_norm.weight", vec(s.ssm_head))
            add(p + "ssm_out.weight", mat(s.n_embd, value_dim, 0.5 * gain))
        add(p + "ffn_gate.weight", mat(s.n_ff, s.n_embd))
        add(p + "ffn_up.weight", mat(s.n_ff, s.n_embd))
        add(p + "ffn_down.weight", mat(s.n_embd, s.n_ff, 0.5 * gain))
    return out


def _mtp_tensors(s: Shape, trunk: list[Tensor]) -> list[Tensor]:
    """One MTP (``nextn``) layer at block ``n_layer``, where llama.cpp's qwen35 loader looks for
    it: a full-attention block (a copy of the trunk's first attention layer) after ``eh_proj``,
    which adds the normed embedding of the token and the normed hidden state of the target
    before it. On random weights about half of its first guesses are the target's tokens (the
    state carries most of what the target writes next). The head and its norm are the
    model's own (tied)."""
    first = s.interval - 1
    src, dst = f"blk.{first}.", f"blk.{s.n_layer}."
    out: list[Tensor] = [(dst + name[len(src):], data, qtype) for name, data, qtype in trunk if name.startswith(src)]
    wtype = {"f32": np.float32, "f16": np.float16}[s.dtype]
    eye = np.eye(s.n_embd, dtype=np.float32)
    out.append((dst + "nextn.eh_proj.weight", np.concatenate([eye, eye], axis=1).astype(wtype), None))
    out.append((dst + "nextn.enorm.weight", np.ones(s.n_embd, dtype=np.float32), None))
    out.append((dst + "nextn.hnorm.weight", np.ones(s.n_embd, dtype=np.float32), None))
    return out


def _write(out: PathLike, s: Shape, n_layer: int, tokenizer: dict[str, tuple[object, gguf.GGUFValueType,
           gguf.GGUFValueType | None]], tensors: list[Tensor], name: str, mtp: int = 0) -> None:
    arch = "qwen35"
    n_rot = s.head_dim // 2  # partial rotary, as Qwen3.5 (a quarter of its 256-dim heads)
    w = gguf.GGUFWriter(str(out), arch=arch)
    w.add_name(name)
    w.add_string(SYNTHETIC_KEY, "random weights: for correctness and cost tests, not text quality")
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(n_layer + mtp)  # llama.cpp counts the MTP layers as blocks after the trunk
    if mtp:
        w.add_uint32(gguf.Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch), mtp)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(n_rot)
    w.add_array(gguf.Keys.Rope.DIMENSION_SECTIONS.format(arch=arch), _sections(n_rot))
    w.add_rope_freq_base(10_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(gguf.Keys.SSM.CONV_KERNEL.format(arch=arch), s.conv)
    w.add_uint32(gguf.Keys.SSM.INNER_SIZE.format(arch=arch), s.ssm_head * s.ssm_heads)
    w.add_uint32(gguf.Keys.SSM.STATE_SIZE.format(arch=arch), s.ssm_head)
    w.add_uint32(gguf.Keys.SSM.TIME_STEP_RANK.format(arch=arch), s.ssm_heads)
    w.add_uint32(gguf.Keys.SSM.GROUP_COUNT.format(arch=arch), s.ssm_groups)
    w.add_uint32(gguf.Keys.LLM.FULL_ATTENTION_INTERVAL.format(arch=arch), s.interval)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if s.dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    for key, (value, vtype, sub) in tokenizer.items():
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name_, data, qtype in tensors:
        block = _BLOCK.match(name_)
        if block is None or int(block.group(1)) < n_layer + mtp:
            w.add_tensor(name_, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _sections(n_rot: int) -> list[int]:
    """Rotary sections (temporal, height, width, extra) over n_rot / 2 frequency pairs, in
    Qwen3.5's proportions (11, 11, 10, 0 of 32); text positions are equal in all of them."""
    pairs = n_rot // 2
    t = pairs - 2 * (pairs // 3)
    return [t, pairs // 3, pairs // 3, 0]
