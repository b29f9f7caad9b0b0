"""Data-parallel serving on Ray Serve: engine replicas behind one
OpenAI-compatible endpoint, routed by the prefix cache.

- :mod:`.routing`: the routing rule and the block hash -> replicas index (no Ray).
- :mod:`.kv_subscriber`: the replicas' KV events applied to the index.
- :mod:`.replica`: ``EngineReplica``, one ``AsyncLLM`` as a Ray Serve deployment.
- :mod:`.router`: ``PrefixCacheRouter``, the Ray Serve request router.
- :mod:`.pool_client`: ``ReplicaPoolClient``, the server's ``EngineClient`` over the replicas.
- :mod:`.app`: ``build_serve_app`` and ``pagedrs serve --ray``.

Everything but :mod:`.routing` needs ``ray[serve]`` (``pip install "pagedrs[ray]"``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_serve_app"]


def build_serve_app(*args: Any, **kwargs: Any) -> Any:
    """:func:`pagedrs.serve.app.build_serve_app` (imports Ray on first use)."""
    from .app import build_serve_app as build

    return build(*args, **kwargs)
