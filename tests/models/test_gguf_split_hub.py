"""Split GGUF files (llama.cpp's ``-0000i-of-0000n.gguf`` parts, written by
gguf-py's ``GGUFWriter(split_max_tensors=...)``) and Hub references
``org/repo:QUANT``, resolved offline from a local Hub cache."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
import torch
from gguf_files import write_tiny_llama
from pagedrs import LLM, SamplingParams
from pagedrs.cli import main
from pagedrs.executor.gguf_hub import matches_tag, parse_hub_gguf, tag_glob
from pagedrs.executor.model_loader import load_model, local_model_path
from pagedrs.executor.quant.gguf_split import read_gguf

PROMPTS = ["The quick brown fox", "A GGUF file holds"]
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, logprobs=2)


def _run(model: str, **kwargs: object) -> list[tuple[list[int], float]]:
    llm = LLM(model, max_model_len=64, kv_cache_memory_bytes=1 << 22, **kwargs)
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].cumulative_logprob) for o in outs]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """The tiny Llama as one file and as three split parts (same seed)."""
    root = tmp_path_factory.mktemp("split")
    (root / "whole").mkdir()
    (root / "parts").mkdir()
    whole = write_tiny_llama(root / "whole" / "tiny-Q8_0.gguf")[0]
    parts = write_tiny_llama(root / "parts" / "tiny-Q8_0.gguf", split_max_tensors=8)
    return whole, parts


def test_parts_are_llama_cpp_layout(files: tuple[Path, list[Path]]) -> None:
    whole, parts = files
    assert [p.name for p in parts] == [f"tiny-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    joined = read_gguf(parts[0])
    single = read_gguf(whole)
    assert [t.name for t in joined.tensors] == [t.name for t in single.tensors]
    assert {t.part for t in joined.tensors} == {0, 1, 2}
    for a, b in zip(joined.tensors, single.tensors, strict=True):
        assert (joined.data(a) == single.data(b)).all()


def test_split_equals_whole(files: tuple[Path, list[Path]]) -> None:
    whole, parts = files
    assert _run(str(parts[0])) == _run(str(whole))


def test_missing_or_mismatched_part(tmp_path: Path, files: tuple[Path, list[Path]]) -> None:
    _, parts = files
    for p in parts:
        shutil.copy(p, tmp_path / p.name)
    first = tmp_path / parts[0].name
    with pytest.raises(
        ValueError,
        match=r"tiny-Q8_0-00002-of-00003\.gguf is part 2 of 3 .*load "
        r"the first part, tiny-Q8_0-00001-of-00003\.gguf",
    ):
        load_model(str(tmp_path / parts[1].name), torch.float32, torch.device("cpu"))
    # Part 3 in place of part 2: its split.no is 2.
    shutil.copy(parts[2], tmp_path / parts[1].name)
    with pytest.raises(
        ValueError,
        match=r"tiny-Q8_0-00002-of-00003\.gguf: mismatched split GGUF "
        r"part: expected split\.no 1 of split\.count 3 .*found split\.no 2 of "
        r"split\.count 3",
    ):
        load_model(str(first), torch.float32, torch.device("cpu"))
    (tmp_path / parts[1].name).unlink()
    with pytest.raises(
        ValueError,
        match=r"split GGUF part 2 of 3 is missing: no file .*"
        r"tiny-Q8_0-00002-of-00003\.gguf",
    ):
        load_model(str(first), torch.float32, torch.device("cpu"))


def test_tensor_count_key(tmp_path: Path, files: tuple[Path, list[Path]]) -> None:
    _, parts = files
    for p in parts:
        shutil.copy(p, tmp_path / p.name)
    first = tmp_path / parts[0].name
    blob = bytearray(first.read_bytes())
    key = b"split.tensors.count"
    at = blob.index(len(key).to_bytes(8, "little") + key) + 8 + len(key)
    kind = struct.unpack_from("<I", blob, at)[0]
    fmt = {4: "<I", 5: "<i", 2: "<H", 3: "<h"}[kind]
    struct.pack_into(fmt, blob, at + 4, 21)
    first.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match=r"holds 20 tensors, expected split\.tensors\.count 21"):
        load_model(str(first), torch.float32, torch.device("cpu"))


def test_tags() -> None:
    assert parse_hub_gguf("org/Repo-GGUF:Q4_K_M") == ("org/Repo-GGUF", "Q4_K_M")
    assert parse_hub_gguf("org/repo") is None
    assert parse_hub_gguf("./dir/x:Q4") is None
    assert matches_tag("Qwen2.5-0.5B-Instruct-q4_k_m.gguf", "Q4_K_M")
    assert matches_tag("Q4_K_M/model-00001-of-00002.gguf", "q4_k_m")
    assert not matches_tag("model-Q4_K_M.gguf", "Q4_K")
    assert matches_tag("model-UD-Q4_K_XL.gguf", "ud-q4_k_xl")
    assert tag_glob("Q4_K_M") == "*[qQ]4_[kK]_[mM]*.gguf"


def _hub_cache(root: Path, repo: str, files: dict[str, Path], commit: str = "b" * 40) -> Path:
    """``root`` laid out as huggingface_hub's cache: ``files`` (name in the
    repository -> file) in one snapshot of ``repo``, blobs linked as the
    library links them."""
    org, name = repo.split("/")
    repo_dir = root / f"models--{org}--{name}"
    snap = repo_dir / "snapshots" / commit
    (repo_dir / "blobs").mkdir(parents=True)
    for i, (rel, src) in enumerate(files.items()):
        blob = repo_dir / "blobs" / f"{i:064x}"
        shutil.copy(src, blob)
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).symlink_to(blob)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    return root


def test_hub_reference_offline(
    tmp_path: Path, files: tuple[Path, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    whole, parts = files
    layout = {"tiny-Q8_0.gguf": whole, "tiny-Q4_0.gguf": whole}
    layout.update({f"Q8_0-split/{p.name}": p for p in parts})
    cache = _hub_cache(tmp_path / "hub", "tiny-org/tiny-GGUF", layout)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    want = _run(str(whole))
    path = local_model_path("tiny-org/tiny-GGUF:q4_0")
    assert Path(path).name == "tiny-Q4_0.gguf"
    assert _run("tiny-org/tiny-GGUF:q4_0") == want
    assert _run("tiny-org/tiny-GGUF:Q8_0-split") == want  # the split parts, first part named
    with pytest.raises(
        ValueError,
        match=r"tiny-org/tiny-GGUF:Q8_0: quant 'Q8_0' matches several "
        r"models: \['Q8_0-split/tiny-Q8_0-00001-of-00003\.gguf', 'tiny-Q8_0\.gguf'\]",
    ):
        local_model_path("tiny-org/tiny-GGUF:Q8_0")
    with pytest.raises(
        ValueError,
        match=r"tiny-org/tiny-GGUF:Q6_K: no \.gguf file for quant "
        r"'Q6_K' in .*tiny-Q4_0\.gguf",
    ):
        local_model_path("tiny-org/tiny-GGUF:Q6_K")
    with pytest.raises(
        ValueError,
        match=r"unknown model 'tiny-org/tiny-GGUF'.*revision 'v2'|"
        r"unknown model 'tiny-org/tiny-GGUF': not in the Hub cache",
    ):
        local_model_path("tiny-org/tiny-GGUF:Q4_0", revision="v2")
    with pytest.raises(ValueError, match=r"unknown model 'tiny-org/missing'"):
        local_model_path("tiny-org/missing:Q4_0")


def test_hub_reference_download_dir_and_cli(
    tmp_path: Path,
    files: tuple[Path, list[Path]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    whole, _ = files
    cache = _hub_cache(tmp_path / "mine", "tiny-org/tiny-GGUF", {"tiny.Q8_0.gguf": whole})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert _run("tiny-org/tiny-GGUF:Q8_0", download_dir=str(cache)) == _run(str(whole))
    argv = ["generate", "--model", "tiny-org/tiny-GGUF:Q8_0", "--download-dir", str(cache)]
    assert main([*argv, "--max-tokens", "3", "--max-model-len", "64", "The quick"]) == 0
    assert "[3 tokens" in capsys.readouterr().out
