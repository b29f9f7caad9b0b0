"""Corrupt and hostile GGUF files: each refused by a ValueError naming the
file, the key or tensor, expected and found, before transformers parses the
file; a fuzz test of byte flips and truncations sees nothing else or a
loaded model."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf_files import write_tiny_llama
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pagedrs.executor import model_loader
from pagedrs.executor.model_loader import load_model, load_tokenizer
from pagedrs.executor.quant.gguf_header import read_header

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def no_metadata_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostile files leave no entries in pagedrs' GGUF metadata cache."""
    monkeypatch.setenv("PAGEDRS_GGUF_CACHE", "0")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_llama(path)
    return path


def _load(path: Path) -> None:
    load_model(str(path), torch.float32, CPU)


@pytest.fixture()
def no_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if transformers is asked to parse the file: the
    refusals come first."""

    class _Refuse:
        @staticmethod
        def from_pretrained(*args: object, **kwargs: object) -> None:
            raise AssertionError("transformers parsed a file pagedrs should have refused")

    monkeypatch.setattr(model_loader, "AutoConfig", _Refuse)


def _entry(blob: bytes, name: str) -> int:
    """Offset of tensor ``name``'s dims in the tensor table of ``blob``."""
    key = len(name).to_bytes(8, "little") + name.encode()
    return blob.index(key) + len(key) + 4  # after the n_dims field


def _bad(tmp: Path, blob: bytes | bytearray, name: str = "bad.gguf") -> Path:
    path = tmp / name
    path.write_bytes(bytes(blob))
    return path


def test_the_tiny_file_loads(tiny: Path) -> None:
    model = load_model(str(tiny), torch.float32, CPU)
    assert model.config.num_hidden_layers == 2


@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.999])
def test_truncated(tmp_path: Path, tiny: Path, fraction: float, no_transformers: None) -> None:
    blob = tiny.read_bytes()
    path = _bad(tmp_path, blob[: int(len(blob) * fraction)])
    with pytest.raises(ValueError, match=r"bad\.gguf.*(past the end|the file ends after)"):
        _load(path)


def test_magic_and_22_bytes(tmp_path: Path, tiny: Path, no_transformers: None) -> None:
    blob = tiny.read_bytes()
    with pytest.raises(ValueError, match=r"bad\.gguf: no GGUF magic \(expected b'GGUF', found"):
        _load(_bad(tmp_path, b"GGML" + blob[4:]))
    with pytest.raises(ValueError, match=r"bad\.gguf: 22 bytes, shorter than a GGUF header"):
        _load(_bad(tmp_path, blob[:22]))
    # A whole fixed header that promises keys the file does not hold.
    with pytest.raises(ValueError, match=r"bad\.gguf: truncated.*metadata key #0 needs 8 bytes"):
        _load(_bad(tmp_path, blob[:24]))


def test_version(tmp_path: Path, tiny: Path, no_transformers: None) -> None:
    blob = bytearray(tiny.read_bytes())
    blob[4:8] = (4).to_bytes(4, "little")
    with pytest.raises(ValueError, match=r"bad\.gguf: GGUF version 4 \(read: \(2, 3\)"):
        _load(_bad(tmp_path, blob))


def test_offset_past_the_end(tmp_path: Path, tiny: Path, no_transformers: None) -> None:
    blob = bytearray(tiny.read_bytes())
    at = _entry(blob, "output_norm.weight") + 8 + 4  # one dim, then the type
    offset = struct.unpack_from("<Q", blob, at)[0]
    struct.pack_into("<Q", blob, at, offset + 1 << 20)
    with pytest.raises(
        ValueError,
        match=r"bad\.gguf: tensor 'output_norm\.weight' \(F32, shape \[64\]\) needs 256 bytes "
        r"at offset \d+, but the file ends after 0 of them",
    ):
        _load(_bad(tmp_path, blob))


def test_size_does_not_match_type_and_shape(
    tmp_path: Path, tiny: Path, no_transformers: None
) -> None:
    blob = bytearray(tiny.read_bytes())
    at = _entry(blob, "blk.0.attn_q.weight")
    assert struct.unpack_from("<QQ", blob, at) == (64, 64)
    struct.pack_into("<QQ", blob, at, 64, 128)  # twice the rows the data holds
    with pytest.raises(
        ValueError,
        match=r"bad\.gguf: tensor 'blk\.0\.attn_q\.weight' \(Q8_0, shape \[64, 128\]\) needs "
        r"8704 bytes at offset \d+, but tensor 'blk\.0\.attn_k\.weight' starts after 4352 of them",
    ):
        _load(_bad(tmp_path, blob))


def test_unknown_type(tmp_path: Path, tiny: Path, no_transformers: None) -> None:
    blob = bytearray(tiny.read_bytes())
    at = _entry(blob, "blk.1.ffn_up.weight") + 16
    assert struct.unpack_from("<I", blob, at)[0] == gguf.GGMLQuantizationType.Q8_0
    struct.pack_into("<I", blob, at, 99)
    with pytest.raises(
        ValueError, match=r"bad\.gguf: tensor 'blk\.1\.ffn_up\.weight' has ggml type 99"
    ):
        _load(_bad(tmp_path, blob))


def test_unsupported_type(tmp_path: Path) -> None:
    path = tmp_path / "q2k.gguf"
    write_tiny_llama(path, raw_types={"blk.0.ffn_down.weight": "IQ4_NL"})
    with pytest.raises(
        ValueError, match=r"q2k\.gguf: tensor 'blk\.0\.ffn_down\.weight' has type IQ4_NL, which "
    ):
        _load(path)


def _set_f16(tmp: Path, tiny: Path, tensor: str, byte: int, value: float) -> Path:
    header = read_header(tiny)
    t = next(t for t in header.tensors if t.name == tensor)
    blob = bytearray(tiny.read_bytes())
    struct.pack_into("<e", blob, t.data_offset + byte, value)
    return _bad(tmp, blob)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_scale(tmp_path: Path, tiny: Path, value: float, no_transformers: None) -> None:
    # Q8_0 blocks are 34 bytes, a float16 scale first; a 128-value row is 4 blocks.
    path = _set_f16(tmp_path, tiny, "blk.1.ffn_down.weight", 34 * (4 * 5 + 2), value)
    with pytest.raises(
        ValueError,
        match=r"bad\.gguf: tensor 'blk\.1\.ffn_down\.weight' \(Q8_0\) has a non-finite block "
        rf"scale: expected a finite float16 at byte 0 of block 2 of row 5, found {value}",
    ):
        _load(path)


def test_non_finite_float_tensor(tmp_path: Path, tiny: Path, no_transformers: None) -> None:
    header = read_header(tiny)
    t = next(t for t in header.tensors if t.name == "blk.0.ffn_norm.weight")
    blob = bytearray(tiny.read_bytes())
    struct.pack_into("<f", blob, t.data_offset + 4 * 9, float("nan"))
    with pytest.raises(
        ValueError,
        match=r"bad\.gguf: tensor 'blk\.0\.ffn_norm\.weight' \(F32\): expected finite values, "
        r"found a NaN or infinity at row 0, column 9",
    ):
        _load(_bad(tmp_path, blob))


def test_vocabulary_shorter_than_the_embedding(tmp_path: Path, no_transformers: None) -> None:
    path = tmp_path / "short.gguf"
    write_tiny_llama(path, drop_tokens=7)
    with pytest.raises(
        ValueError,
        match=r"short\.gguf: the vocabulary 'tokenizer\.ggml\.tokens' has 393 tokens, expected "
        r"one per row of tensor 'token_embd\.weight' \(400 rows\)",
    ):
        _load(path)


def test_block_count(tmp_path: Path, tiny: Path, no_transformers: None) -> None:
    blob = bytearray(tiny.read_bytes())
    key = b"llama.block_count"
    at = blob.index(len(key).to_bytes(8, "little") + key) + 8 + len(key) + 4
    assert struct.unpack_from("<I", blob, at)[0] == 2
    struct.pack_into("<I", blob, at, 1 << 30)
    with pytest.raises(
        ValueError,
        match=r"bad\.gguf: metadata 'llama\.block_count' is 1073741824, but the tensor table "
        r"holds blocks blk\.0 to blk\.1 \(expected 2\)",
    ):
        _load(_bad(tmp_path, blob))


def test_cli_prints_one_line(
    tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pagedrs.cli import main

    path = _bad(tmp_path, tiny.read_bytes()[:22])
    assert main(["generate", "--model", str(path), "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"pagedrs: error: {path}: 22 bytes, shorter than a GGUF header (24 bytes: "
        "magic, version, tensor and key counts)"
    ]


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzz_flips_and_truncations(tmp_path: Path, tiny: Path, data: st.DataObject) -> None:
    blob = bytearray(tiny.read_bytes())
    header = read_header(tiny)
    header_end = min(t.data_offset for t in header.tensors)
    header.buffer.close()
    anywhere = st.integers(0, len(blob) - 1)
    in_header = st.integers(0, header_end - 1)
    if data.draw(st.booleans(), label="truncate"):
        blob = blob[: data.draw(anywhere, label="length")]
    else:
        flips = data.draw(
            st.lists(
                st.tuples(st.one_of(in_header, anywhere), st.integers(0, 7)), min_size=1, max_size=4
            ),
            label="flips",
        )
        for at, bit in flips:
            blob[at] ^= 1 << bit
    path = _bad(tmp_path, blob, "fuzz.gguf")
    try:
        load_model(str(path), torch.float32, CPU)
        load_tokenizer(str(path))
    except ValueError as e:
        assert str(path) in str(e), e
    np.testing.assert_equal(True, True)


def test_size_key_larger_than_the_tensors(tmp_path: Path, tiny: Path) -> None:
    blob = bytearray(tiny.read_bytes())
    # The vocabulary size comes from token_embd's shape; the FFN width only
    # from this key.
    key = b"llama.feed_forward_length"
    at = blob.index(len(key).to_bytes(8, "little") + key) + 8 + len(key)
    assert struct.unpack_from("<I", blob, at)[0] == 4  # GGUF type UINT32
    struct.pack_into("<I", blob, at + 4, 1 << 30)  # a 256 GiB MLP if it were made
    with pytest.raises(
        ValueError,
        match=r"bad\.gguf: the config its metadata gives \(\{.*'intermediate_size': 1073741824"
        r".*\) makes a model of [\d,]+ parameters, but its tensors hold 99,648 values",
    ):
        _load(_bad(tmp_path, blob))
