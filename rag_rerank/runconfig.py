"""The configuration a resumable output records, and how a resumed run is compared with it.

`rag-rerank eval --resume` (a header line) and `rag-rerank batch --resume` (a `config` object in
every record) continue a file only when this run would produce the same results as the one that
wrote it: a file half written by one backend, model or embedder and finished by another mixes two
systems' results without a word. Both write what they record through here, so the rules are one:
URLs are shown as `display_url` shows them (credentials masked, since the file is kept and shared),
and a difference is named setting by setting (`model: file 'a', now 'b'`) so the user sees which
flag to change back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .redaction import display_url

EMBED_URL = "embed_base_url"


def embedder_server(embedder: Any) -> dict[str, Any]:
    """Where an embeddings-server embedder sends its texts: the same model name on another server
    (an openai backend's --base-url, --embed-base-url, OPENAI_BASE_URL) gives other vectors, so
    other post-pass decisions, and a resumed file must not mix the two. `{}` for an embedder that
    calls no server."""
    if not hasattr(embedder, "base_url"):
        return {}
    # As shown, credentials masked: the configuration is written to a file.
    url = getattr(embedder, "base_url", None) or os.environ.get("OPENAI_BASE_URL")
    return {EMBED_URL: display_url(url) or None}


def config_difference(written: Any, config: Mapping[str, Any]) -> str:
    """Which settings differ between a recorded configuration and this run's, as
    `name: file X, now Y` joined by `; ` (a setting only one side has counts as a difference)."""
    if not isinstance(written, Mapping):
        return f"it records {str(written)[:80]!r} as its configuration"
    names = [*config, *(k for k in written if k not in config)]
    diffs = [f"{name}: file {written.get(name)!r}, now {config.get(name)!r}" for name in names
             if written.get(name) != config.get(name) or (name in written) != (name in config)]
    return "; ".join(diffs) or "the configuration differs"
