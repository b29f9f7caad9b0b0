"""The GGUF header reader (``executor/quant/gguf_header.py``) against gguf-py's
``GGUFReader`` on the same files, and its refusals of broken files."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from pagedrs.executor.quant.gguf_header import GGUFHeaderError, read_header


def _write(path: Path) -> None:
    """A small GGUF with every metadata value kind and F32, F16, BF16, Q8_0 tensors."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("test.u32", 7)
    w.add_int64("test.i64", -3)
    w.add_float32("test.f32", 0.5)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "héllo")
    w.add_array("test.ints", [1, 2, 3])
    w.add_array("test.strs", ["a", "bc", ""])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((7,)).astype(np.float16))
    bf16 = rng.integers(0, 255, (2, 8), dtype=np.uint8)
    w.add_tensor("bf16", bf16, raw_dtype=gguf.GGMLQuantizationType.BF16)
    q8 = rng.integers(0, 255, (4, 2 * 34), dtype=np.uint8)
    w.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _same_as_gguf_reader(path: Path) -> None:
    header = read_header(path)
    reader = gguf.GGUFReader(path)
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for mine, ref in zip(header.tensors, reader.tensors, strict=True):
        assert mine.dims == tuple(int(d) for d in ref.shape)
        assert mine.type_name == ref.tensor_type.name
        assert mine.ggml_type == int(ref.tensor_type)
        assert mine.data_offset == int(ref.data_offset)
        assert mine.n_bytes == int(ref.n_bytes)
        data = header.data(mine)
        assert data.shape == ref.data.shape and data.dtype == ref.data.dtype
        assert np.array_equal(data.view(np.uint8), np.asarray(ref.data).view(np.uint8))
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        if isinstance(value, list):
            assert header.metadata[key] == len(value), key
        else:
            assert header.metadata[key] == value, key


def test_every_value_kind_and_float_types(tmp_path: Path) -> None:
    path = tmp_path / "kinds.gguf"
    _write(path)
    _same_as_gguf_reader(path)
    header = read_header(path)
    assert header.metadata["test.str"] == "héllo"
    assert header.metadata["test.strs"] == 3
    assert header.metadata["test.f32"] == 0.5


def test_smollm2_q4_1_same_as_gguf_reader(smol_gguf: Path) -> None:
    _same_as_gguf_reader(smol_gguf)


def test_gemma3_q4_k_m_same_as_gguf_reader(gemma_gguf: Path) -> None:
    _same_as_gguf_reader(gemma_gguf)


def test_truncated_header_refused(tmp_path: Path) -> None:
    path = tmp_path / "kinds.gguf"
    _write(path)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:100])
    with pytest.raises(GGUFHeaderError, match=r"cut\.gguf.*past the end"):
        read_header(cut)


def test_tensor_past_end_refused(tmp_path: Path) -> None:
    path = tmp_path / "kinds.gguf"
    _write(path)
    cut = tmp_path / "cut.gguf"
    last = read_header(path).tensors[-1]
    cut.write_bytes(path.read_bytes()[: last.data_offset + last.n_bytes - 1])
    with pytest.raises(
        GGUFHeaderError,
        match=r"cut\.gguf: tensor 'q8' \(Q8_0, shape \[64, 4\]\) needs 272 bytes at offset "
        r"\d+, but the file ends after 271 of them",
    ):
        read_header(cut)


@pytest.mark.parametrize(
    ("blob", "what"),
    [
        (b"GGUL" + b"\0" * 60, "no GGUF magic"),
        (b"GGUF" + (1).to_bytes(4, "little") + b"\0" * 60, "version 1"),
        (b"GGUF" + b"\xff" * 64, "version 4294967295"),
        (b"GGUF", "shorter than a GGUF header"),
    ],
)
def test_not_gguf_refused(tmp_path: Path, blob: bytes, what: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    with pytest.raises(GGUFHeaderError, match=rf"bad\.gguf.*{what}"):
        read_header(path)


def test_rows_not_whole_blocks_refused(tmp_path: Path) -> None:
    path = tmp_path / "kinds.gguf"
    _write(path)
    blob = bytearray(path.read_bytes())
    # The q8 tensor's table entry: name, 2 dims (64 values per row, 4 rows), type Q8_0.
    entry = len(b"q8").to_bytes(8, "little") + b"q8" + (2).to_bytes(4, "little")
    at = blob.index(entry) + len(entry)
    assert int.from_bytes(blob[at : at + 8], "little") == 64
    blob[at : at + 8] = (65).to_bytes(8, "little")
    odd = tmp_path / "odd.gguf"
    odd.write_bytes(bytes(blob))
    with pytest.raises(GGUFHeaderError, match=r"odd\.gguf: tensor 'q8' \(Q8_0\).*32-value blocks"):
        read_header(odd)


def test_first_parse_keeps_the_vocabulary_for_the_tokenizer(
    smol_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A header's first parse walks the vocabulary once: it returns the arrays
    # as counts, and a later read asking for the tokenizer's arrays (the set
    # gguf_tokens reads) gets them whole without a second walk.
    from pagedrs.executor import gguf_tokens
    from pagedrs.executor.quant import gguf_header, gguf_parses

    assert frozenset(gguf_tokens.TOKENIZER_ARRAYS) == gguf_parses.VOCABULARY_ARRAYS
    monkeypatch.setattr(gguf_parses, "_parsed", type(gguf_parses._parsed)())
    monkeypatch.setattr(gguf_parses, "_store", None)
    walks = []
    real = gguf_header._read_tables

    def counting(cur, arrays):  # type: ignore[no-untyped-def]
        walks.append(arrays)
        return real(cur, arrays)

    monkeypatch.setattr(gguf_header, "_read_tables", counting)
    plain = read_header(smol_gguf)
    vocab = read_header(smol_gguf, arrays=gguf_tokens.TOKENIZER_ARRAYS)
    assert walks == [gguf_parses.VOCABULARY_ARRAYS]
    reader = gguf.GGUFReader(smol_gguf)
    for key in gguf_parses.VOCABULARY_ARRAYS:
        want = reader.fields[key].contents()
        assert plain.metadata[key] == len(want)
        got = vocab.metadata[key]
        assert (got if isinstance(got, list) else got.tolist()) == want, key
    assert {k: v for k, v in vocab.metadata.items() if k not in gguf_parses.VOCABULARY_ARRAYS} == {
        k: v for k, v in plain.metadata.items() if k not in gguf_parses.VOCABULARY_ARRAYS
    }
    assert vocab.tensors == plain.tensors
