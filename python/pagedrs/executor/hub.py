"""The Hugging Face Hub: model ids (``org/name``), offline mode
(``HF_HUB_OFFLINE``) and snapshot downloads into the Hub cache
(``$HF_HUB_CACHE``). ``huggingface_hub`` is imported only when a download
starts."""

from __future__ import annotations

import os
from pathlib import Path

#: Files fetched from the Hub for a model: config, weights, tokenizer.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt"]


def is_hub_id(model: str) -> bool:
    """``org/name``: two non-empty parts, no path syntax."""
    parts = model.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not model.startswith((".", "~"))
        and not any(p in (".", "..") for p in parts)
    )


def offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it (any true-ish value)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def download_from_hub(
    model: str,
    revision: str | None = None,
    download_dir: str | None = None,
    allow_patterns: list[str] | None = None,
) -> Path:
    """The local snapshot folder of Hub model ``model`` (``org/name``).

    Uses ``huggingface_hub.snapshot_download``: ``revision`` (branch, tag or
    commit; default ``main``), cache ``download_dir`` (default ``$HF_HUB_CACHE``
    or huggingface_hub's own default), the token from the environment
    (``HF_TOKEN`` or the saved login), cached files only when
    ``HF_HUB_OFFLINE`` is set; the files matching ``allow_patterns``
    (default ``HUB_PATTERNS``).

    Raises:
        ValueError: an unknown id, a missing revision, or (offline) a model not
            in the cache.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = download_dir or os.environ.get("HF_HUB_CACHE") or None
    try:
        folder = snapshot_download(
            model,
            revision=revision,
            cache_dir=cache,
            local_files_only=offline(),
            allow_patterns=allow_patterns or HUB_PATTERNS,
        )
    except RevisionNotFoundError as e:
        raise ValueError(f"unknown model {model!r}: no revision {revision!r} on the Hub") from e
    except RepositoryNotFoundError as e:
        raise ValueError(f"unknown model {model!r}: no such repository on the Hub") from e
    except LocalEntryNotFoundError as e:
        where = "offline (HF_HUB_OFFLINE)" if offline() else "the Hub is unreachable"
        raise ValueError(
            f"unknown model {model!r}: not in the Hub cache ({cache or 'default'}) and {where}"
        ) from e
    except HfHubHTTPError as e:
        raise ValueError(f"unknown model {model!r}: the Hub answered {e}") from e
    return Path(str(folder))
