"""Hub references to a GGUF file: ``org/repo:QUANT`` (vLLM's and llama.cpp's
``-hf`` form), e.g. ``bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M``.

The quant tag names the file among the repository's ``.gguf`` files: a file
matches when the tag's parts (split at ``-``, ``.`` and ``/``) appear, in
order and case-insensitively, among the parts of its path inside the
repository (``Qwen2.5-0.5B-Instruct-Q4_K_M.gguf``,
``q4_k_m/model-00001-of-00002.gguf``). Of a split model (``gguf_split``) the
first part is the file; every part is fetched. ``huggingface_hub``'s
``snapshot_download`` fetches only the matching files (``allow_patterns``, the
tag as a case-insensitive glob), at ``revision``, into ``$HF_HUB_CACHE`` (or
``download_dir``), from the cache alone when ``HF_HUB_OFFLINE`` is set.
"""

from __future__ import annotations

import re
from pathlib import Path

from .hub import download_from_hub
from .quant.gguf_split import SPLIT_NAME

#: ``org/repo:TAG``: a Hub id and a quant tag.
HUB_GGUF = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+):(?P<tag>[\w.-]+)$")

_PARTS = re.compile(r"[-./]")


def parse_hub_gguf(model: str) -> tuple[str, str] | None:
    """``(repo, tag)`` of an ``org/repo:TAG`` reference, else None."""
    match = HUB_GGUF.match(model)
    return (match["repo"], match["tag"]) if match else None


def tag_glob(tag: str) -> str:
    """``allow_patterns`` glob of the ``.gguf`` files whose path holds
    ``tag`` in any letter case (fnmatch is case-sensitive on POSIX)."""
    out = "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in tag)
    return f"*{out}*.gguf"


def matches_tag(relative: str, tag: str) -> bool:
    """Whether ``relative`` (a path inside the repository) names the quant
    ``tag`` (module docs)."""
    parts = _PARTS.split(relative.lower())
    want = _PARTS.split(tag.lower())
    return any(parts[i : i + len(want)] == want for i in range(len(parts) - len(want) + 1))


def pick_gguf(folder: Path, tag: str, reference: str) -> Path:
    """The one model file of ``folder`` (a snapshot) matching ``tag``: a
    whole file or a split model's first part.

    Raises:
        ValueError: no such file (listing the ``.gguf`` files present), or
            files of more than one model (listing them).
    """
    present = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.gguf"))
    hits = [r for r in present if matches_tag(r, tag)]
    models = [r for r in hits if not (m := SPLIT_NAME.match(Path(r).name)) or int(m["no"]) == 1]
    if len(models) == 1:
        return folder / models[0]
    if not models:
        raise ValueError(
            f"{reference}: no .gguf file for quant {tag!r} in {folder} (files there: "
            f"{present or 'none'})"
        )
    raise ValueError(f"{reference}: quant {tag!r} matches several models: {models}")


def download_gguf(
    repo: str,
    tag: str,
    revision: str | None = None,
    download_dir: str | None = None,
) -> Path:
    """The local path of the GGUF file quant ``tag`` of Hub repository
    ``repo`` names (module docs), fetched with its split parts.

    Raises:
        ValueError: as ``hub.download_from_hub`` (unknown repository
            or revision, not cached offline) and ``pick_gguf``.
    """
    reference = f"{repo}:{tag}"
    folder = download_from_hub(repo, revision, download_dir, allow_patterns=[tag_glob(tag)])
    return pick_gguf(folder, tag, reference)
