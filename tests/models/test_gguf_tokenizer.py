"""A GGUF file's tokenizer as pagedrs builds it (``executor/gguf_tokenizer.py``,
``gguf_bpe.py``, ``gguf_spm.py``) against transformers' own
(``AutoTokenizer.from_pretrained(..., gguf_file=...)``, cutting text as
llama.cpp does for a byte-level BPE): the files written from the metadata
equal those transformers saves, for SmolLM2, Gemma 3 and
test-written files (byte-level BPE of every ``pre``, token type and flag;
Gemma SentencePiece vocabularies with byte fallback, whitespace tokens,
control and user-defined tokens); the tokenizers give the same ids and texts
for tricky texts (unicode, whitespace runs, special tokens, characters only
byte fallback spells) and for the chat template's output, on the first load
(written from the metadata: transformers' converter never runs) and on a
later one (from the cache)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import pytest
from gguf_files import SPECIALS, bpe_vocab
from model_files import GEMMA3_GGUF, SMOLLM2_GGUF, gguf_file
from pagedrs.executor import gguf_cache
from pagedrs.executor.gguf_bpe import ARRAYS, bpe_tokenizer_files
from pagedrs.executor.gguf_pretok import pre_tokenizer, set_pre_tokenizer
from pagedrs.executor.gguf_spm import spm_tokenizer_files
from pagedrs.executor.gguf_tokenizer import CACHE_KIND, gguf_tokenizer, tokenizer_class
from pagedrs.executor.quant.gguf_header import read_header
from tokenizers import Tokenizer
from transformers import AutoTokenizer

TEXTS = [
    "",
    "Hello world! The quick brown fox.",
    " leading space,  double  spaces,\n\nnew lines\ttabs and trailing   ",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|endoftext|>",
    "<start_of_turn>user\nHi<end_of_turn>\n<bos><eos></s><unk><pad>",
    "Ünïcödé 日本語のテキスト 🙂🚀 مرحبا Здравствуйте ÿ\u00a0\u200b\ufeff",
    "def f(x):\n    return [i ** 2 for i in range(x)]  # comment",
    "12345678901234567890 3.14159 1e-10 0x1F don't I'll WE'RE",
    "<|reserved_special_token_7|>text<think>\n</think>",
    "byte fallback: \x01\x7f \ue000\U000f0000 \u0378 \U0001fae9 \u2581 \u2581\u2581x",
    "runs:  \t\t  \n\n\n    x     y\u3000\u3000z \r\n",
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Ünïcödé  question 🙂?"},
    {"role": "assistant", "content": "An answer."},
    {"role": "user", "content": "And then?"},
]

#: The chat template used for a file without one (Gemma 3's turn markers).
TURNS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDRS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PAGEDRS_GGUF_CACHE", raising=False)


TOKENS, MERGES = bpe_vocab(400)


def _write(
    path: Path,
    *,
    arch: str = "llama",
    pre: str | None = "default",
    tokens: list[str] | None = None,
    types: dict[int, int] | None = None,
    merges: list[str] | None = MERGES,
    ids: tuple[int | None, ...] = (1, 0, None, None),
    add_bos: bool | None = False,
    add_eos: bool | None = None,
) -> Path:
    """A tensor-less GGUF holding a byte-level BPE tokenizer."""
    tokens = tokens or TOKENS
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("gpt2")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    kinds = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens]
    for i, kind in (types or {}).items():
        kinds[i] = kind
    w.add_token_types(kinds)
    if merges is not None:
        w.add_token_merges(merges)
    for add, value in zip(
        (w.add_bos_token_id, w.add_eos_token_id, w.add_unk_token_id, w.add_pad_token_id),
        ids,
        strict=True,
    ):
        if value is not None:
            add(value)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}"
    )
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


CONTROL, USER, NORMAL = 3, 4, 1
_N = len(TOKENS)
BUILT = {
    "plain": {},
    "no-pre": {"pre": None},
    "llama-bpe-bos": {"pre": "llama-bpe", "add_bos": True},
    "qwen2": {"arch": "qwen2", "pre": "qwen2"},
    "smaug": {"pre": "smaug-bpe"},
    "bos-and-eos-added": {"add_bos": True, "add_eos": True},
    "no-add-bos-key": {"add_bos": None},
    "unk-and-pad": {"ids": (1, 0, 2, 2)},
    "user-defined-and-control": {"types": {10: USER, 11: CONTROL, 12: USER}},
    "bos-a-normal-token": {"ids": (30, 0, None, None), "add_bos": True},
    "bos-user-defined": {"types": {30: USER}, "ids": (30, 0, None, None), "add_bos": True},
    "no-endoftext": {"tokens": ["<|x|>", *TOKENS[1:]], "ids": (1, 2, None, None)},
    "endoftext-normal": {"types": {0: NORMAL}, "ids": (1, 2, None, None)},
    "control-outside-the-alphabet": {"tokens": [*TOKENS, "<ctl é>"], "types": {_N: CONTROL}},
    "user-outside-the-alphabet": {"tokens": [*TOKENS, "<usr é>"], "types": {_N: USER}},
}
LEFT_TO_TRANSFORMERS = {
    "a-name-given-twice": {"tokens": [*TOKENS, "<|im_end|>"], "types": {_N: CONTROL}},
    "gpt2-tokenizer-class": {"arch": "starcoder2"},
    "endoftext-user-defined": {"types": {0: USER}, "ids": (1, 2, None, None)},
}


def _reference(path: Path) -> Any:
    """transformers' tokenizer of GGUF ``path``, cutting text as llama.cpp
    does (``gguf_pretok``; held to llama.cpp in ``test_gguf_pretok.py``)
    where the file holds a byte-level BPE."""
    ref = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    header = read_header(path)
    header.buffer.close()
    if header.metadata.get("tokenizer.ggml.model") == "gpt2":
        set_pre_tokenizer(ref.backend_tokenizer, pre_tokenizer(header.metadata))
    return ref


def _saved(tok: Any, folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """tokenizer.json (as ``tokenizers`` reads it) and tokenizer_config.json
    of ``tok`` saved with ``save_pretrained``."""
    tok.save_pretrained(folder)
    data = json.loads(Tokenizer.from_file(str(folder / "tokenizer.json")).to_str())
    config = json.loads((folder / "tokenizer_config.json").read_text())
    for key in ("is_local", "local_files_only"):  # how the saved one was loaded
        config.pop(key, None)
    return data, config


def _files(path: Path) -> dict[str, str] | None:
    header = read_header(path, arrays=ARRAYS)
    header.buffer.close()
    cls = tokenizer_class(path)
    if cls is None:
        return None
    files = bpe_tokenizer_files(header.metadata, cls.__name__)
    return files if files is not None else spm_tokenizer_files(header.metadata, cls.__name__)


def _same_files(path: Path, tmp: Path) -> None:
    ref = _reference(path)
    assert tokenizer_class(path) is type(ref)
    files = _files(path)
    assert files is not None
    data, config = _saved(ref, tmp / "saved")
    assert json.loads(Tokenizer.from_str(files["tokenizer.json"]).to_str()) == data
    assert json.loads(files["tokenizer_config.json"]) == config


def _same_ids(tok: Any, ref: Any, skipping: bool = True) -> None:
    """Same ids, texts, special tokens and chat ids; ``skipping``: the same
    texts with special tokens skipped too."""
    for text in TEXTS:
        for special in (True, False):
            assert (
                tok(text, add_special_tokens=special).input_ids
                == ref(text, add_special_tokens=special).input_ids
            ), text
        ids = ref(text).input_ids
        assert tok.decode(ids) == ref.decode(ids)
        if skipping:
            assert tok.decode(ids, skip_special_tokens=True) == ref.decode(
                ids, skip_special_tokens=True
            )
    chat: dict[str, Any] = {"tokenize": True, "add_generation_prompt": True}
    if ref.chat_template is None:  # Gemma 3's file has none: a template of its turns
        chat["chat_template"] = TURNS_TEMPLATE
    got = tok.apply_chat_template(MESSAGES, **chat)
    assert got == ref.apply_chat_template(MESSAGES, **chat)
    assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id, tok.pad_token_id) == (
        ref.bos_token_id,
        ref.eos_token_id,
        ref.unk_token_id,
        ref.pad_token_id,
    )
    assert (len(tok), tok.all_special_ids, tok.chat_template) == (
        len(ref),
        ref.all_special_ids,
        ref.chat_template,
    )


@pytest.mark.parametrize("name", list(BUILT))
def test_written_files_equal_transformers(name: str, tmp_path: Path) -> None:
    path = _write(tmp_path / f"{name}.gguf", **BUILT[name])
    _same_files(path, tmp_path)
    ref = _reference(path)
    _same_ids(gguf_tokenizer(path), ref)


@pytest.mark.parametrize("name", list(LEFT_TO_TRANSFORMERS))
def test_left_to_transformers(name: str, tmp_path: Path) -> None:
    path = _write(tmp_path / f"{name}.gguf", **LEFT_TO_TRANSFORMERS[name])
    assert _files(path) is None
    ref = _reference(path)
    tok = gguf_tokenizer(path)
    assert type(tok) is type(ref)
    _same_ids(tok, ref)
    # From the cache. A user-defined <|endoftext|> (special when transformers
    # first adds it) stays special in the memory of the tokenizer it built,
    # plain in the file it saves: decoding with special tokens skipped keeps
    # it after a save.
    _same_ids(gguf_tokenizer(path), ref, skipping=name != "endoftext-user-defined")


def test_smollm2_files_equal_transformers(smol_gguf: Path, tmp_path: Path) -> None:
    _same_files(smol_gguf, tmp_path)


def test_gemma3_files_equal_transformers(gemma_gguf: Path, tmp_path: Path) -> None:
    _same_files(gemma_gguf, tmp_path)


#: A SentencePiece vocabulary as Gemma files hold it: GemmaTokenizer's
#: special tokens first, control turn markers, the 256 byte tokens, pieces
#: with ``▁`` for a space, whitespace runs stored as real whitespace, and
#: user-defined tokens.
SPM_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
SPM_BYTES = [f"<0x{b:02X}>" for b in range(256)]
SPM_PIECES = [
    "\u2581",
    *"elohwrdtansiuxyzqckbfjmpvgTH?!.,:\u00e9\u00fc\u65e5\u672c\U0001f642\n\t",
    *("he", "ll", "hell", "hello", "\u2581h", "\u2581hello", "wo", "wor", "world"),
    *("\u2581world", "th", "the", "\u2581the", "an", "\u2581an", "er", "\u2581q", "qu"),
    *("ick", "\u2581quick", "  ", "   ", " \t\n\n", "\n\n", "\t\t"),
]
SPM_USER = ["<think>", "</think>", "[multimodal]"]
SPM_TOKENS = [*SPM_SPECIALS, *SPM_BYTES, *SPM_PIECES, *SPM_USER]
_M = len(SPM_TOKENS)


def _write_spm(
    path: Path,
    *,
    arch: str = "gemma3",
    tokens: list[str] | None = None,
    types: dict[int, int] | None = None,
    ids: tuple[int | None, ...] = (2, 1, 3, 0),
    add_bos: bool | None = True,
    add_eos: bool | None = None,
    merges: list[str] | None = None,
) -> Path:
    """A tensor-less GGUF holding a Gemma SentencePiece tokenizer."""
    tokens = tokens or SPM_TOKENS
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    kinds = []
    for t in tokens:
        if t in SPM_SPECIALS:
            kinds.append(gguf.TokenType.CONTROL)
        elif t in SPM_BYTES:
            kinds.append(gguf.TokenType.BYTE)
        elif t in SPM_USER:
            kinds.append(gguf.TokenType.USER_DEFINED)
        else:
            kinds.append(gguf.TokenType.NORMAL)
    for i, kind in (types or {}).items():
        kinds[i] = kind
    w.add_token_types(kinds)
    if merges is not None:
        w.add_token_merges(merges)
    for add, value in zip(
        (w.add_bos_token_id, w.add_eos_token_id, w.add_unk_token_id, w.add_pad_token_id),
        ids,
        strict=True,
    ):
        if value is not None:
            add(value)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


SPM_BUILT = {
    "gemma3": {},
    "gemma2-no-add-bos-key": {"arch": "gemma2", "add_bos": None},
    "bos-and-eos-added": {"add_eos": True},
    "no-bos-added": {"add_bos": False},
    "no-special-ids": {"ids": (None, None, None, None)},
    "bos-a-normal-token": {"ids": (300, 1, 3, 0)},
    "user-defined-control": {"types": {_M - 1: CONTROL}},
}
SPM_LEFT_TO_TRANSFORMERS = {
    "a-respelled-name-given-twice": {"tokens": [*SPM_TOKENS, "\u2581\u2581"]},
    "mask-user-defined": {"types": {4: USER}},
    "with-merges": {"merges": ["h e", "l l"]},
}


@pytest.mark.parametrize("name", list(SPM_BUILT))
def test_spm_written_files_equal_transformers(name: str, tmp_path: Path) -> None:
    path = _write_spm(tmp_path / f"{name}.gguf", **SPM_BUILT[name])
    _same_files(path, tmp_path)
    ref = _reference(path)
    _same_ids(gguf_tokenizer(path), ref)
    _same_ids(gguf_tokenizer(path), ref)  # from the cache


@pytest.mark.parametrize("name", list(SPM_LEFT_TO_TRANSFORMERS))
def test_spm_left_to_transformers(name: str, tmp_path: Path) -> None:
    path = _write_spm(tmp_path / f"{name}.gguf", **SPM_LEFT_TO_TRANSFORMERS[name])
    assert _files(path) is None
    ref = _reference(path)
    tok = gguf_tokenizer(path)
    assert type(tok) is type(ref)
    _same_ids(tok, ref)


@pytest.mark.parametrize("name", [SMOLLM2_GGUF, GEMMA3_GGUF])
def test_first_and_cached_load_equal_transformers(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both tokenizers are written from the metadata (transformers'
    converter never runs), then read back from the cache."""
    from transformers.integrations import gguf as hf_gguf
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    path = gguf_file(name)
    ref = _reference(path)
    assert not gguf_cache.entry(path, CACHE_KIND).exists()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("transformers' GGUF tokenizer converter ran")

    monkeypatch.setattr(hf_gguf, "convert_gguf_tokenizer", refuse)
    monkeypatch.setattr(TokenizersBackend, "__init__", _no_gguf_file(TokenizersBackend))
    first = gguf_tokenizer(path)
    assert gguf_cache.entry(path, CACHE_KIND).is_dir()
    cached = gguf_tokenizer(path)
    for tok in (first, cached):
        assert type(tok).__name__ == type(ref).__name__
        _same_ids(tok, ref)


def _no_gguf_file(cls: type) -> Any:
    original = cls.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        assert kwargs.get("gguf_file") is None, "transformers built the tokenizer from the GGUF"
        original(self, *args, **kwargs)

    return init


def test_unloadable_written_files_fall_back_to_transformers(tmp_path: Path) -> None:
    """Merges naming a token the vocabulary lacks: ``tokenizers`` refuses the
    written files, transformers' build raises the same error, named."""
    path = _write(tmp_path / "bad.gguf", merges=[*MERGES, "Ġnot-a-token x"])
    with pytest.raises(ValueError, match=r"bad\.gguf: transformers cannot build the tokenizer"):
        gguf_tokenizer(path)
    assert not gguf_cache.entry(path, CACHE_KIND).exists()


@pytest.mark.parametrize("cache", ["off", "unwritable"])
def test_written_without_a_cache(
    cache: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the cache off or unwritable the files are written to a temporary
    folder and read from there: still no transformers conversion."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    path = _write(tmp_path / "plain.gguf")
    ref = _reference(path)
    if cache == "off":
        monkeypatch.setenv("PAGEDRS_GGUF_CACHE", "0")
    else:
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        monkeypatch.setenv("PAGEDRS_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(TokenizersBackend, "__init__", _no_gguf_file(TokenizersBackend))
    _same_ids(gguf_tokenizer(path), ref)


@pytest.mark.parametrize("case", ["written", "left-to-transformers"])
def test_unknown_pre_tokenizer_refused(case: str, tmp_path: Path) -> None:
    """A ``tokenizer.ggml.pre`` whose cuts pagedrs does not hold is refused
    by name on either path, and nothing is cached."""
    arch = "starcoder2" if case == "left-to-transformers" else "llama"
    path = _write(tmp_path / "unknown-pre.gguf", pre="kimi-k2", arch=arch)
    with pytest.raises(ValueError, match=r"unknown-pre\.gguf: tokenizer\.ggml\.pre 'kimi-k2'"):
        gguf_tokenizer(path)
    assert not gguf_cache.entry(path, CACHE_KIND).exists()


def test_pre_tokenizer_of_another_type_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "int-pre.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_uint32("tokenizer.ggml.pre", 7)
    w.add_token_list(TOKENS)
    w.add_token_merges(MERGES)
    w.add_context_length(64)
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.pre 7: not a string"):
        gguf_tokenizer(path)
