"""Peak memory of loading and running a GGUF file whose weights stay quantized:
within issue 30's bound of 1.25 x the file size + 1 GiB (+ the KV cache).

The file is a ~400 MB Llama-shaped Q4_0 model with random blocks (each block's
float16 scale fixed, its 4-bit values random), written to a tmp dir; a fresh
Python process loads it with ``LLM`` (the native Llama model on the quantized
weights), runs a few greedy steps and reports its ``VmHWM`` (peak resident set,
the mapped file's resident pages included) from ``/proc/self/status``. A float32
copy of the projections would take ~2.8 GB, far past the bound."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 2048, 8192, 10, 32, 8, 49152
KV_BYTES = 32 << 20


def _q4_0_blocks(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, cols / 32 * 18]: Q4_0 blocks with scale 1/512 and random nibbles."""
    blocks = rng.integers(0, 256, size=(rows * cols // 32, 18), dtype=np.uint8)
    blocks[:, :2] = np.array([1 / 512], dtype=np.float16).view(np.uint8)
    return blocks.reshape(rows, cols // 32 * 18)


def write_random_llama(path: Path) -> None:
    """A Llama-shaped Q4_0 GGUF with random blocks and no tokenizer fields."""
    import gguf

    kv = KV_HEADS * HIDDEN // HEADS
    mats = [("token_embd.weight", VOCAB, HIDDEN)]
    norms = ["output_norm.weight"]
    for i in range(LAYERS):
        mats += [
            (f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN),
            (f"blk.{i}.attn_k.weight", kv, HIDDEN),
            (f"blk.{i}.attn_v.weight", kv, HIDDEN),
            (f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN),
            (f"blk.{i}.ffn_gate.weight", FFN, HIDDEN),
            (f"blk.{i}.ffn_up.weight", FFN, HIDDEN),
            (f"blk.{i}.ffn_down.weight", HIDDEN, FFN),
        ]
        norms += [f"blk.{i}.attn_norm.weight", f"blk.{i}.ffn_norm.weight"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_vocab_size(VOCAB)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_0))
    q4_0 = gguf.GGMLQuantizationType.Q4_0
    for name, rows, cols in mats:
        shape = (rows, cols // 32 * 18)
        w.add_tensor_info(name, shape, np.dtype(np.uint8), rows * cols // 32 * 18, raw_dtype=q4_0)
    for name in norms:
        w.add_tensor_info(name, (HIDDEN,), np.dtype(np.float32), HIDDEN * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for _name, rows, cols in mats:
        w.write_tensor_data(_q4_0_blocks(rows, cols, rng))
    for _name in norms:
        w.write_tensor_data(np.ones(HIDDEN, dtype=np.float32))
    w.close()


_RUN = """
import json, sys
from pathlib import Path
from pagedrs import LLM, SamplingParams
path, tok, kv = sys.argv[1], sys.argv[2], int(sys.argv[3])
llm = LLM(model=path, tokenizer=tok, max_model_len=64, kv_cache_memory_bytes=kv)
params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
outs = llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}] * 2, params, use_tqdm=False)
status = dict(
    (k, int(v.split()[0]) * 1024)
    for k, _, v in (ln.partition(":") for ln in Path("/proc/self/status").read_text().splitlines())
    if k in ("VmHWM", "RssAnon", "RssFile")
)
status["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
print(json.dumps(status))
"""


def test_gguf_load_peak_rss_within_bound(tmp_path: Path, default_model_dir: Path) -> None:
    """The default model's folder gives the tokenizer (49,152 tokens)."""
    path = tmp_path / "random-llama.Q4_0.gguf"
    write_random_llama(path)
    size = path.stat().st_size
    assert size > 350e6
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, str(path), str(default_model_dir), str(KV_BYTES)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    status = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(len(t) == 4 for t in status["tokens"])
    bound = 1.25 * size + (1 << 30) + KV_BYTES
    assert status["VmHWM"] <= bound, (
        f"peak RSS {status['VmHWM'] / 2**30:.2f} GiB over {bound / 2**30:.2f} GiB "
        f"(file {size / 2**30:.2f} GiB; at the end anon {status['RssAnon'] / 2**30:.2f}, "
        f"file-backed {status['RssFile'] / 2**30:.2f} GiB)"
    )
