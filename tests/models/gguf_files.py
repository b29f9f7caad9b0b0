"""Tiny GGUF files written by the tests: a 2-layer Llama with random weights
quantized by gguf-py, and a byte-level BPE tokenizer trained with
``tokenizers`` on a small corpus, stored in llama.cpp's ``tokenizer.ggml.*``
keys (GPT-2 style: tokens, token types, merges, special-token ids)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps the key-value cache in fixed-size blocks.",
    "A GGUF file holds the tensors and the tokenizer of a model.",
    "llama.cpp reads split files: name-00001-of-00003.gguf and the rest.",
    "Héllo wörld, naïve café: unicode text 你好 and emoji 🙂 too.",
    "Numbers 12345 and 3.14159, code like def f(x): return x * 2",
] * 20


def bpe_vocab(vocab_size: int = 400) -> tuple[list[str], list[str]]:
    """Tokens (by id) and merges of a byte-level BPE trained on ``CORPUS``
    with ``SPECIALS`` first (ids 0, 1, 2)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    state = json.loads(tok.to_str())["model"]
    vocab = sorted(state["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["merges"]]
    return [t for t, _ in vocab], merges


def tensor_plan(vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """GGUF tensor names and numpy shapes (rows, row length) of the tiny Llama."""
    head_dim = HIDDEN // HEADS
    plan: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, HIDDEN))]
    for i in range(LAYERS):
        plan += [
            (f"blk.{i}.attn_norm.weight", (HIDDEN,)),
            (f"blk.{i}.attn_q.weight", (HIDDEN, HIDDEN)),
            (f"blk.{i}.attn_k.weight", (KV_HEADS * head_dim, HIDDEN)),
            (f"blk.{i}.attn_v.weight", (KV_HEADS * head_dim, HIDDEN)),
            (f"blk.{i}.attn_output.weight", (HIDDEN, HIDDEN)),
            (f"blk.{i}.ffn_norm.weight", (HIDDEN,)),
            (f"blk.{i}.ffn_gate.weight", (FFN, HIDDEN)),
            (f"blk.{i}.ffn_up.weight", (FFN, HIDDEN)),
            (f"blk.{i}.ffn_down.weight", (HIDDEN, FFN)),
        ]
    plan.append(("output_norm.weight", (HIDDEN,)))
    return plan


def write_tiny_llama(
    path: Path,
    qtype: str = "Q8_0",
    *,
    chat_template: str | None = CHAT_TEMPLATE,
    split_max_tensors: int = 0,
    vocab_size: int = 400,
    seed: int = 0,
    raw_types: dict[str, str] | None = None,
    drop_tokens: int = 0,
) -> list[Path]:
    """Write the tiny Llama to ``path`` (with ``split_max_tensors``, as
    llama.cpp's split parts ``<stem>-0000i-of-0000n.gguf`` beside it).

    ``raw_types`` writes the named tensors as random bytes of another ggml
    block type; ``drop_tokens`` leaves the last tokens out of the vocabulary
    (the embedding keeps its rows).

    Returns:
        The files written, first part first.
    """
    tokens, merges = bpe_vocab(vocab_size)
    n_rows = len(tokens)
    if drop_tokens:
        tokens = tokens[:-drop_tokens]
        merges = [m for m in merges if "".join(m.split(" ")) in tokens]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    w.add_name("tiny-llama")
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    types = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens]
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|endoftext|>"))
    w.add_eot_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    qt = gguf.GGMLQuantizationType[qtype]
    for name, shape in tensor_plan(n_rows):
        if raw_types and name in raw_types:
            raw = gguf.GGMLQuantizationType[raw_types[name]]
            block, block_bytes = gguf.GGML_QUANT_SIZES[raw]
            data = rng.integers(0, 256, (shape[0], shape[1] // block * block_bytes), np.uint8)
            w.add_tensor(name, data, raw_dtype=raw)
        elif len(shape) == 1:
            w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
        else:
            values = (0.1 * rng.standard_normal(shape)).astype(np.float32)
            w.add_tensor(name, gguf.quants.quantize(values, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split_max_tensors:
        return sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf"))
    return [path]
