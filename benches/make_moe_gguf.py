"""Write a Qwen3-30B-A3B-shaped GGUF file with random weights in llama.cpp's Q4_K_M
mix, for measuring pagedrs and llama.cpp on the identical mixture-of-experts file
at its real size (no hub access here).

The shape is Qwen3-30B-A3B's (``SHAPE``): 48 layers, hidden 2048, 32 query / 4 KV
heads of 128 with q/k RMS norms, 128 experts of FFN 768 with 8 routed per token
(routing weights renormalized over the top 8), vocabulary 151,936, RoPE base
1,000,000, RMS norm eps 1e-6, a separate LM head; context length 8,192 (the real
40,960 only sizes a default KV cache larger).

Tensor types as ``llama-quantize`` gives Q4_K_M: Q4_K everywhere, Q6_K for the LM
head and for ``attn_v`` and ``ffn_down_exps`` of the layers llama.cpp's
``use_more_bits`` picks (the first and last eighth and every third between);
norms and the router ``ffn_gate_inp`` in F32. ``gguf.quants.quantize`` cannot
write K types, so every block is a random valid one: random quants and sub-block
scales, the f16 super-block scales set so the values' standard deviation is
``STD`` (measured on a sample block set with gguf's dequantization). Tensors are
made and written one at a time (the largest is one layer's expert stack,
~113 MB), so memory stays far below the file size.

The tokenizer fields are SmolLM2-135M's (``make_gguf.add_tokenizer``), padded to
151,936 tokens with control tokens.

    python benches/make_moe_gguf.py [--out DIR] [--layers N] [--check]

Writes ``DIR/qwen3moe-30b-a3b-random.Q4_K_M.gguf`` (DIR default
``~/.cache/pagedrs/gguf``; ``--layers`` fewer than 48 writes a shorter file named
by its layer count); ``--check`` then decodes one token with llama.cpp.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from make_gguf import OUT_DIR, add_tokenizer, write_and_check

STD = 0.02
#: bytes of random blocks made at once
CHUNK_BYTES = 1 << 27


@dataclass(frozen=True)
class MoeShape:
    """A Qwen3-MoE model shape (HF config names)."""

    hidden_size: int = 2048
    num_hidden_layers: int = 48
    num_attention_heads: int = 32
    num_key_value_heads: int = 4
    head_dim: int = 128
    num_experts: int = 128
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    intermediate_size: int = 6144
    vocab_size: int = 151936
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    context_length: int = 8192


SHAPE = MoeShape()


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers whose ``attn_v`` / ``ffn_down`` a ``*_M``
    mix keeps in the wider type: the first and last eighth and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


Dims = tuple[int, ...]


def tensor_plan(shape: MoeShape) -> list[tuple[str, Dims, str]]:
    """(GGUF tensor name, numpy-order shape, GGML type name) of every tensor, in
    file order; a projection's last dimension is its input features."""
    h, e, f = shape.hidden_size, shape.num_experts, shape.moe_intermediate_size
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_key_value_heads * shape.head_dim
    n = shape.num_hidden_layers
    plan: list[tuple[str, Dims, str]] = [("token_embd.weight", (shape.vocab_size, h), "Q4_K")]
    for i in range(n):
        wide = "Q6_K" if use_more_bits(i, n) else "Q4_K"
        b = f"blk.{i}"
        plan += [
            (f"{b}.attn_norm.weight", (h,), "F32"),
            (f"{b}.attn_q.weight", (q, h), "Q4_K"),
            (f"{b}.attn_k.weight", (kv, h), "Q4_K"),
            (f"{b}.attn_v.weight", (kv, h), wide),
            (f"{b}.attn_output.weight", (h, q), "Q4_K"),
            (f"{b}.attn_q_norm.weight", (shape.head_dim,), "F32"),
            (f"{b}.attn_k_norm.weight", (shape.head_dim,), "F32"),
            (f"{b}.ffn_norm.weight", (h,), "F32"),
            (f"{b}.ffn_gate_inp.weight", (e, h), "F32"),
            (f"{b}.ffn_gate_exps.weight", (e, f, h), "Q4_K"),
            (f"{b}.ffn_up_exps.weight", (e, f, h), "Q4_K"),
            (f"{b}.ffn_down_exps.weight", (e, h, f), wide),
        ]
    plan += [
        ("output_norm.weight", (h,), "F32"),
        ("output.weight", (shape.vocab_size, h), "Q6_K"),
    ]
    return plan


class RandomBlocks:
    """Random valid Q4_K / Q6_K blocks whose values have standard deviation ``STD``."""

    def __init__(self, qtype: str, rng: np.random.Generator) -> None:
        import gguf

        self.qtype = qtype
        self.rng = rng
        self.t = gguf.GGMLQuantizationType[qtype]
        self.block, self.size = gguf.GGML_QUANT_SIZES[self.t]
        sample = self._raw(4096)
        self._set_scales(sample, 1e-3)
        std = float(gguf.quants.dequantize(sample.reshape(1, -1), self.t).std())
        self.d = 1e-3 * STD / std

    def _raw(self, n_blocks: int) -> np.ndarray:
        return np.frombuffer(bytearray(self.rng.bytes(n_blocks * self.size)), np.uint8).reshape(
            n_blocks, self.size
        )

    def _set_scales(self, raw: np.ndarray, d: float) -> None:
        if self.qtype == "Q4_K":  # d, dmin (f16) lead the block; dmin = 7.5 d centres it
            raw[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
            raw[:, 2:4] = np.frombuffer(np.float16(7.5 * d).tobytes(), np.uint8)
        elif self.qtype == "Q6_K":  # d (f16) ends the block
            raw[:, self.size - 2 :] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        else:
            raise ValueError(f"no random-block writer for {self.qtype}")

    def nbytes(self, dims: Dims) -> int:
        return int(np.prod(dims)) // self.block * self.size

    def chunks(self, dims: Dims) -> list[np.ndarray]:
        """The tensor's bytes as chunks of whole blocks, in order."""
        total = int(np.prod(dims)) // self.block
        step = max(1, CHUNK_BYTES // self.size)
        out = []
        for b0 in range(0, total, step):
            raw = self._raw(min(step, total - b0))
            self._set_scales(raw, self.d)
            out.append(raw.reshape(-1))
        return out


def _add_metadata(writer: object, shape: MoeShape, name: str) -> None:
    import gguf

    w: gguf.GGUFWriter = writer  # type: ignore[assignment]
    a = "qwen3moe"
    w.add_name(name)
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.hidden_size)
    w.add_block_count(shape.num_hidden_layers)
    w.add_feed_forward_length(shape.intermediate_size)
    w.add_head_count(shape.num_attention_heads)
    w.add_head_count_kv(shape.num_key_value_heads)
    w.add_uint32(f"{a}.attention.key_length", shape.head_dim)
    w.add_uint32(f"{a}.attention.value_length", shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_norm_eps)
    w.add_uint32(f"{a}.expert_count", shape.num_experts)
    w.add_uint32(f"{a}.expert_used_count", shape.num_experts_per_tok)
    w.add_uint32(f"{a}.expert_feed_forward_length", shape.moe_intermediate_size)
    w.add_vocab_size(shape.vocab_size)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer(w, shape.vocab_size)


def default_path(out: Path = OUT_DIR, layers: int = SHAPE.num_hidden_layers) -> Path:
    """Where ``make_moe_gguf.py`` writes its file."""
    tag = "30b-a3b" if layers == SHAPE.num_hidden_layers else f"30b-a3b-{layers}l"
    return out / f"qwen3moe-{tag}-random.Q4_K_M.gguf"


def write_gguf(path: Path, shape: MoeShape = SHAPE, seed: int = 0) -> Path:
    """Write a random-weight Qwen3-MoE GGUF of ``shape`` to ``path`` (through
    ``path.tmp``, renamed when complete); returns ``path``."""
    import gguf

    rng = np.random.default_rng(seed)
    blocks = {q: RandomBlocks(q, rng) for q in ("Q4_K", "Q6_K")}
    plan = tensor_plan(shape)
    tmp = path.with_suffix(path.suffix + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(tmp), "qwen3moe")
    _add_metadata(writer, shape, path.stem)
    for name, dims, q in plan:
        if q == "F32":
            writer.add_tensor_info(name, dims, np.dtype(np.float32), int(np.prod(dims)) * 4)
            continue
        rb = blocks[q]
        byte_shape = (*dims[:-1], dims[-1] // rb.block * rb.size)
        writer.add_tensor_info(
            name, byte_shape, np.dtype(np.uint8), rb.nbytes(dims), raw_dtype=rb.t
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, dims, q in plan:
        if q == "F32":
            if name.endswith("ffn_gate_inp.weight"):
                data = rng.standard_normal(dims, dtype=np.float32) * STD
            else:
                data = np.ones(dims, dtype=np.float32)
            writer.write_tensor_data(data)
            continue
        _write_chunks(writer, blocks[q].chunks(dims))
    writer.close()
    tmp.rename(path)
    return path


def _write_chunks(writer: object, chunks: list[np.ndarray]) -> None:
    """The next tensor's data written from ``chunks`` (as ``write_tensor_data``
    does for one array: aligned start, padded end)."""
    import gguf

    w: gguf.GGUFWriter = writer  # type: ignore[assignment]
    assert w.fout is not None
    fout = w.fout[0]
    ti = w.tensors[0].pop(next(iter(w.tensors[0])))
    nbytes = sum(c.nbytes for c in chunks)
    assert ti.nbytes == nbytes, (ti.nbytes, nbytes)
    w.write_padding(fout, fout.tell())
    for chunk in chunks:
        chunk.tofile(fout)
    w.write_padding(fout, nbytes)
    w.state = gguf.gguf_writer.WriterState.WEIGHTS


def ensure(out: Path = OUT_DIR) -> Path:
    """The full-size file, written first if missing."""
    path = default_path(out)
    if not path.exists():
        write_gguf(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    ap.add_argument("--layers", type=int, default=SHAPE.num_hidden_layers)
    ap.add_argument("--force", action="store_true", help="rewrite an existing file")
    ap.add_argument("--check", action="store_true", help="decode one token with llama.cpp")
    args = ap.parse_args()
    shape = MoeShape(num_hidden_layers=args.layers)
    path = default_path(args.out, args.layers)
    write_and_check(path, lambda: write_gguf(path, shape), args)


if __name__ == "__main__":
    main()
