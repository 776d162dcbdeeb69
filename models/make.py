"""Make the GGUF models tests and benchmarks need, in seconds, with no download.

- ``random_llama``: a llama-architecture model with random weights on a real vocabulary
  (any vocab-only GGUF, e.g. llama.cpp's ggml-vocab-llama-bpe.gguf), sizes by argument.
- ``cut_layers``: a draft made of a model's first N transformer blocks (same embeddings and
  head), tensors copied as they are (quantized ones included).
- ``quantize``: a draft quantized with llama.cpp's own quantizer.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from fly_cpp.backend.model import quantize  # noqa: F401  (re-exported: part of the kit)
from fly_cpp.basics.errors import FlyError

PathLike = str | os.PathLike[str]
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _copy_fields(reader: gguf.GGUFReader, writer: gguf.GGUFWriter, prefixes: tuple[str, ...],
                 override: dict[str, Any] | None = None) -> None:
    """Copy key/value fields that start with one of ``prefixes`` (values in ``override`` win)."""
    override = override or {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or not key.startswith(prefixes):
            continue
        value = override.get(key, field.contents())
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub)


_SCALAR = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
           12: "<f8"}


def tokenizer_fields(path: PathLike) -> dict[str, tuple[object, gguf.GGUFValueType, gguf.GGUFValueType | None]]:
    """The ``tokenizer.*`` fields of a GGUF file: key -> (value, type, array item type), read
    straight from the header (gguf.GGUFReader takes seconds over a 150k-token vocabulary's
    strings; this takes a fraction of one)."""
    data = Path(path).read_bytes()
    pos = 24  # magic, version, tensor count
    n_kv = int(np.frombuffer(data, "<u8", 1, 16)[0])

    def u64() -> int:
        nonlocal pos
        pos += 8
        return int.from_bytes(data[pos - 8:pos], "little")

    def string() -> str:
        nonlocal pos
        n = u64()
        pos += n
        raw = data[pos - n:pos]
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw  # type: ignore[return-value]  # written back as the same bytes

    def value(kind: int) -> object:
        nonlocal pos
        if kind == 8:
            return string()
        dt = np.dtype(_SCALAR[kind])
        pos += dt.itemsize
        v = np.frombuffer(data, dt, 1, pos - dt.itemsize)[0]
        return bool(v) if kind == 7 else v.item()

    out: dict[str, tuple[object, gguf.GGUFValueType, gguf.GGUFValueType | None]] = {}
    for _ in range(n_kv):
        key = string()
        kind = int.from_bytes(data[pos:pos + 4], "little")
        pos += 4
        if kind == 9:
            item = int.from_bytes(data[pos:pos + 4], "little")
            pos += 4
            count = u64()
            if item == 8:
                val: object = [string() for _ in range(count)]
            else:
                dt = np.dtype(_SCALAR[item])
                val = np.frombuffer(data, dt, count, pos).tolist()
                pos += dt.itemsize * count
            sub: gguf.GGUFValueType | None = gguf.GGUFValueType(item)
        else:
            val, sub = value(kind), None
        if key.startswith("tokenizer."):
            out[key] = (val, gguf.GGUFValueType(kind), sub)
    return out


def random_llama(
    vocab: PathLike,
    out: PathLike,
    *,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int | None = None,
    n_ff: int | None = None,
    n_ctx: int = 2048,
    seed: int = 0,
    dtype: str = "f32",
    logit_scale: float = 4.0,
) -> Path:
    """Write a random-weight llama GGUF on the vocabulary of ``vocab``.

    Weights are scaled so activations stay near unit size and the output logits spread over
    a few nats (``logit_scale``): distributions are peaked enough to give clear greedy
    choices, yet varied enough that a draft sometimes disagrees.
    """
    tokenizer = tokenizer_fields(vocab)
    if "tokenizer.ggml.tokens" not in tokenizer:
        raise FlyError(f"{vocab} has no tokenizer.ggml.tokens: not a vocabulary GGUF")
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"][0])  # type: ignore[arg-type]
    n_head_kv = n_head_kv or n_head
    n_ff = n_ff or 4 * n_embd
    head_dim = n_embd // n_head
    if head_dim * n_head != n_embd:
        raise FlyError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
    rng = np.random.default_rng(seed)
    np_dtype = {"f32": np.float32, "f16": np.float16}[dtype]

    def mat(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np_dtype)

    writer = gguf.GGUFWriter(str(out), arch="llama")
    writer.add_name(f"random-llama-{n_embd}x{n_layer}")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    for key, (value, vtype, sub) in tokenizer.items():
        writer.add_key_value(key, value, vtype, sub_type=sub)

    ones = np.ones(n_embd, dtype=np.float32)
    writer.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd)).astype(np_dtype))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", mat(n_vocab, n_embd, logit_scale))
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.attn_q.weight", mat(n_head * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", mat(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", mat(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", mat(n_embd, n_head * head_dim, 0.5))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", mat(n_embd, n_ff, 0.5))
    _write(writer)
    return Path(out)


def cut_layers(src: PathLike, out: PathLike, n_layer: int) -> Path:
    """Write a copy of ``src`` that keeps only its first ``n_layer`` transformer blocks."""
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    key = f"{arch}.block_count"
    total = reader.fields[key].contents()
    if not 1 <= n_layer <= total:
        raise FlyError(f"{src} has {total} layers; cannot keep {n_layer}")
    return _copy(reader, out, {key: n_layer}, keep=lambda name: not (
        (block := _BLOCK.match(name)) and int(block.group(1)) >= n_layer))


def with_metadata(src: PathLike, out: PathLike, **fields: str | int | float | bool) -> Path:
    """Write a copy of ``src`` with string/number/bool metadata set, e.g.
    ``with_metadata(a, b, **{"tokenizer.chat_template": "..."})``."""
    return _copy(gguf.GGUFReader(str(src)), out, fields)


_VALUE_TYPES = {str: gguf.GGUFValueType.STRING, bool: gguf.GGUFValueType.BOOL,
                int: gguf.GGUFValueType.UINT32, float: gguf.GGUFValueType.FLOAT32}


def _copy(reader: gguf.GGUFReader, out: PathLike, override: dict[str, Any], keep: Any = lambda name: True) -> Path:
    writer = gguf.GGUFWriter(str(out), arch=reader.fields["general.architecture"].contents())
    _copy_fields(reader, writer, ("",), override=override)
    for key, value in override.items():
        if key not in reader.fields:
            writer.add_key_value(key, value, _VALUE_TYPES[type(value)])
    for t in reader.tensors:
        if keep(t.name):
            writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    _write(writer)
    return Path(out)


def _write(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
