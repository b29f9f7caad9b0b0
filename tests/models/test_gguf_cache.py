"""The config and tokenizer of a GGUF file kept in pagedrs' cache
(``executor/gguf_cache.py``): what a later load reads back equals what
transformers builds from the file, and a later load does not parse the file's
metadata again."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_files import CORPUS, write_tiny_llama
from model_files import GEMMA3_GGUF, SMOLLM2_GGUF, gguf_file
from pagedrs import LLM, SamplingParams
from pagedrs.executor import gguf_cache
from pagedrs.executor.gguf_tokenizer import CACHE_KIND
from pagedrs.executor.model_loader import load_config, load_tokenizer
from transformers import AutoTokenizer

REAL = [SMOLLM2_GGUF, GEMMA3_GGUF]

TEXTS = [
    *CORPUS[:6],
    "",
    " leading space and  double  spaces\n\nnew lines\ttabs",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nHi<end_of_turn>\n<bos><eos></s>",
    "Ünïcödé 日本語のテキスト 🙂🚀 مرحبا Здравствуйте",
    "def f(x):\n    return [i ** 2 for i in range(x)]  # comment",
    "12345678901234567890 3.14159 1e-10 0x1F",
]


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PAGEDRS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PAGEDRS_GGUF_CACHE", raising=False)
    return tmp_path / "cache"


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    return path


def _same_tokenizer(path: Path) -> None:
    assert not gguf_cache.entry(path, CACHE_KIND).exists()
    ref = load_tokenizer(str(path))  # transformers' tokenizer of the file, saved
    assert gguf_cache.entry(path, CACHE_KIND).is_dir()
    again = load_tokenizer(str(path))  # read back from the cache
    for tok in (again,):
        for text in TEXTS:
            assert tok(text).input_ids == ref(text).input_ids, text
            assert (
                tok(text, add_special_tokens=False).input_ids
                == ref(text, add_special_tokens=False).input_ids
            )
            ids = ref(text).input_ids
            assert tok.decode(ids) == ref.decode(ids)
            assert tok.decode(ids, skip_special_tokens=True) == ref.decode(
                ids, skip_special_tokens=True
            )
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (
            ref.bos_token_id,
            ref.eos_token_id,
            ref.pad_token_id,
        )
        assert len(tok) == len(ref)
        assert tok.all_special_ids == ref.all_special_ids
    assert again.chat_template == ref.chat_template
    assert (
        type(ref).__name__
        == type(AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)).__name__
    )


def test_tiny_tokenizer_same_as_transformers(tiny: Path) -> None:
    _same_tokenizer(tiny)
    assert load_tokenizer(str(tiny)).chat_template is not None


@pytest.mark.parametrize("name", REAL)
def test_real_tokenizers_same_as_transformers(name: str) -> None:
    path = gguf_file(name)
    _same_tokenizer(path)


def test_cached_config_same_as_the_files(tiny: Path) -> None:
    """The cached config equals the one read from the file's metadata
    (``gguf_archs.read_config``; ``test_gguf_archs`` holds it to transformers)."""
    from pagedrs.executor.quant.gguf_archs import read_config

    ref = read_config(tiny).to_dict()
    load_config(tiny.parent, tiny.name)
    assert gguf_cache.entry(tiny, "config").is_dir()
    again = load_config(tiny.parent, tiny.name).to_dict()
    drop = {"_name_or_path", "transformers_version"}
    assert {k: v for k, v in again.items() if k not in drop} == {
        k: v for k, v in ref.items() if k not in drop
    }


def test_second_load_reads_no_metadata(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=5, logprobs=1)
    first = LLM(str(tiny), max_model_len=64, kv_cache_memory_bytes=1 << 22)
    want = first.generate(["The quick brown fox"], params, use_tqdm=False)[0].outputs[0]
    from transformers import modeling_gguf_pytorch_utils as mgpu

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the GGUF metadata was parsed again")

    monkeypatch.setattr(mgpu, "load_gguf_checkpoint", refuse)
    second = LLM(str(tiny), max_model_len=64, kv_cache_memory_bytes=1 << 22)
    got = second.generate(["The quick brown fox"], params, use_tqdm=False)[0].outputs[0]
    assert (got.token_ids, got.cumulative_logprob) == (want.token_ids, want.cumulative_logprob)


_SECOND_LOAD = """
import sys
from pagedrs import LLM, SamplingParams
llm = LLM(sys.argv[1], max_model_len=64, kv_cache_memory_bytes=1 << 22)
out = llm.generate(["The quick brown fox"], SamplingParams(temperature=0.0, max_tokens=3))
print(out[0].outputs[0].token_ids)
print(sorted(n for n in ("gguf", "transformers.modeling_gguf_pytorch_utils") if n in sys.modules))
"""


def test_second_load_imports_no_gguf_parser(tiny: Path, own_cache: Path) -> None:
    """A load whose config, tokenizer, header parse and tensor-name map are
    cached imports neither gguf-py nor transformers' GGUF utilities (their
    import is most of a small file's load), and gives the same tokens."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PAGEDRS_CACHE": str(own_cache)}

    def run() -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", _SECOND_LOAD, str(tiny)],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip().splitlines()[-2:]

    first = run()
    second = run()
    assert second[0] == first[0]
    assert second[1] == "[]", f"imported on a cached load: {second[1]}"


def test_edited_header_is_a_new_entry(tiny: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    write_tiny_llama(other, chat_template="{{ messages[0]['content'] }}")
    assert gguf_cache.header_digest(other) != gguf_cache.header_digest(tiny)
    assert load_tokenizer(str(tiny)).chat_template != load_tokenizer(str(other)).chat_template


def test_off_and_unwritable(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDRS_GGUF_CACHE", "0")
    load_tokenizer(str(tiny))
    assert not (tmp_path / "cache").exists()
    monkeypatch.delenv("PAGEDRS_GGUF_CACHE")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("PAGEDRS_CACHE", str(blocker / "cache"))  # not a folder: cannot save
    assert load_tokenizer(str(tiny))("The quick").input_ids
    assert not gguf_cache.entry(tiny, CACHE_KIND).exists()


def test_value_check_remembered_per_unchanged_file(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check of every block scale runs once per file; a file written
    since (a new modification time) is checked again."""
    import os

    from pagedrs.executor.quant import gguf_check

    calls: list[str] = []
    original = gguf_check._check_values

    def counting(model: object, t: object) -> None:
        calls.append(getattr(t, "name", ""))
        original(model, t)  # type: ignore[arg-type]

    monkeypatch.setattr(gguf_check, "_check_values", counting)
    load_config(tiny.parent, tiny.name)
    checked = len(calls)
    assert checked > 0
    load_config(tiny.parent, tiny.name)
    assert len(calls) == checked  # remembered
    st = tiny.stat()
    os.utime(tiny, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    load_config(tiny.parent, tiny.name)
    assert len(calls) == 2 * checked
    monkeypatch.setenv("PAGEDRS_GGUF_CACHE", "0")
    load_config(tiny.parent, tiny.name)
    assert len(calls) == 3 * checked


def test_special_tokens_cached_same_as_the_files(tiny: Path) -> None:
    from pagedrs.executor.gguf_tokens import read_special_tokens, special_tokens

    assert not gguf_cache.entry(tiny, "special_tokens.json").exists()
    first = special_tokens(tiny)
    assert gguf_cache.entry(tiny, "special_tokens.json").exists()
    assert special_tokens(tiny) == first == read_special_tokens(tiny)


def test_header_parse_kept_for_the_same_bytes(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A later process reads the header's parse from the cache (no walk over
    the vocabulary) while the file's header bytes are the same; a header
    edited in place, even with its size and modification time kept, is
    walked again."""
    import os

    from pagedrs.executor.quant import gguf_header, gguf_parses

    def parse(path: Path) -> tuple[dict[str, object], tuple[object, ...]]:
        gguf_parses._parsed.clear()  # as in a new process
        header = gguf_header.read_header(path)
        header.buffer.close()
        return header.metadata, header.tensors

    walked = parse(tiny)  # walked, and kept
    gguf_cache._digests.clear()
    original = gguf_header._read_tables
    calls: list[Path] = []

    def counting(cur: object, arrays: frozenset[str]) -> object:
        calls.append(cur.path)  # type: ignore[attr-defined]
        return original(cur, arrays)  # type: ignore[arg-type]

    monkeypatch.setattr(gguf_header, "_read_tables", counting)
    assert parse(tiny) == walked
    assert calls == []
    assert gguf_cache.header_digest(tiny) == gguf_cache.header_digest(tiny)
    st = tiny.stat()
    blob = bytearray(tiny.read_bytes())
    at = blob.index(b"tiny-llama")
    blob[at : at + 4] = b"TINY"  # general.name, same length
    tiny.write_bytes(bytes(blob))
    os.utime(tiny, ns=(st.st_atime_ns, st.st_mtime_ns))
    edited = parse(tiny)
    assert calls == [tiny]
    assert edited[0]["general.name"] == "TINY-llama"
