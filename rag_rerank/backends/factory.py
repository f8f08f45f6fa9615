"""Backends by name: `make_backend("openai", model=..., base_url=...)` and the checks that make a
misnamed option an error naming it instead of a TypeError deep inside a constructor, or an option
a backend would silently ignore (`model=` with the local scorer).

Its own module because every surface builds backends the same way: `rerank()`, batch, eval, the
framework components, Ray, the MCP server and the CLI. Backends are imported when first named, so
`import rag_rerank` loads no SDK and no model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InputError, Violation
from ..redaction import display_url
from ..wording import near_miss
from .base import Backend
from .common import base_url_problem

BACKENDS = ("local", "openai", "anthropic", "cross-encoder", "rerank-api")
# Keyword options each named backend takes besides model / base_url / api_key (`backend_options`).
BACKEND_OPTIONS: dict[str, tuple[str, ...]] = {
    "local": ("fusion", "bm25"),
    "openai": ("timeout", "temperature", "response_format", "seed", "scoring", "http"),
    "anthropic": ("timeout", "temperature", "http"),
    "cross-encoder": ("batch_size", "device", "max_length", "calibration_factor"),
    "rerank-api": ("timeout", "max_chars", "score_mapping"),
}


def make_backend(
    name: str | Backend,
    *,
    model: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    embedder: Any = "lexical",
    **kw: Any,
) -> Backend:
    """A backend instance from its name; an instance is returned unchanged.

    Build one and pass it to many `rerank` calls to reuse its HTTP connection pool.
    """
    if not isinstance(name, str):
        if callable(getattr(name, "complete", None)) and callable(getattr(name, "acomplete", None)):
            return name
        # Anything else would fail later with an AttributeError deep inside the retry loop.
        msg = (f"backend must be a name ({', '.join(BACKENDS)}) or a Backend instance, "
               f"got {type(name).__name__}")
        raise InputError([Violation(path="backend", message=msg, value=name)])
    if name in BACKEND_OPTIONS:
        unused = unused_option_violations(name, model=model, base_url=base_url, api_key=api_key)
        if unused:
            raise InputError(unused)
    if name in ("openai", "anthropic", "rerank-api") and base_url is not None and (
        problem := base_url_problem(base_url)
    ):
        raise InputError([Violation(path="base_url", message=problem, value=display_url(base_url))])
    if name in BACKEND_OPTIONS:
        check_backend_options(name, kw)
    if name == "local":
        from .local import LocalBackend

        return LocalBackend(embedder=embedder, **kw)
    if name == "openai":
        from .openai import OpenAIBackend

        return OpenAIBackend(model=model, base_url=base_url, api_key=api_key, **kw)
    if name == "anthropic":
        from .anthropic import AnthropicBackend

        return AnthropicBackend(model=model, base_url=base_url, api_key=api_key, **kw)
    if name == "cross-encoder":
        from .cross_encoder import CrossEncoderBackend

        return CrossEncoderBackend(model=model, **kw)
    if name == "rerank-api":
        from .rerank_api import RerankAPIBackend

        return RerankAPIBackend(model=model, base_url=base_url, api_key=api_key, **kw)
    raise InputError(
        [
            Violation(
                path="backend",
                message=f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}",
                value=name,
            )
        ]
    )


# Which of rerank()'s connection options each named backend reads; the others would be ignored.
_CONNECTION_OPTIONS: dict[str, tuple[str, ...]] = {
    "local": (),
    "cross-encoder": ("model",),
    "openai": ("model", "base_url", "api_key"),
    "anthropic": ("model", "base_url", "api_key"),
    "rerank-api": ("model", "base_url", "api_key"),
}


def unused_option_violations(name: str, *, model: Any = None, base_url: Any = None,
                             api_key: Any = None, hints: Mapping[str, str] | None = None) -> list[Violation]:
    """One violation per connection option (`model`, `base_url`, `api_key`) given to a named backend
    that does not read it: `rerank(q, chunks, model="gpt-4o-mini")` without `backend="openai"`
    would otherwise rank with the local scorer, silently (the CLI refuses `-m` with this same check).
    `hints` replace the advice a message ends with, per option (the CLI names its flags)."""
    takes = _CONNECTION_OPTIONS.get(name)
    if takes is None:
        return []
    given = {"model": model, "base_url": base_url, "api_key": api_key}
    readers = {"model": "openai, anthropic, rerank-api or cross-encoder",
               "base_url": "openai, anthropic or rerank-api", "api_key": "openai, anthropic or rerank-api"}
    why = {"model": "its scorer follows the embedder", "base_url": "it calls no server",
           "api_key": "it calls no server"}
    tail = {"base_url": " (an openai embedder's server: embedder=get_embedder('openai', base_url=...))",
            **(hints or {})}
    shown = {"api_key": "***", "base_url": display_url(base_url) if isinstance(base_url, str) else base_url}
    return [Violation(path=key, value=shown.get(key, value),
                      message=f"the {name} backend takes no {key} ({why[key]}); {key} is for backend "
                      f"{readers[key]}{tail.get(key, '')}")
            for key, value in given.items() if value is not None and key not in takes]


def check_backend_options(name: str, options: Mapping[str, Any]) -> None:
    """An option the backend does not take is named, instead of a TypeError from its constructor;
    a near miss of one it takes (`temprature`) gets a did-you-mean, like a batch line's keys."""
    allowed = BACKEND_OPTIONS[name]

    def message(key: Any) -> str:
        text = f"the {name} backend takes no option {key!r}" + near_miss(str(key), allowed)
        return text + (f" (it takes {', '.join(allowed)})" if allowed else "")

    bad = [Violation(path=f"backend_options.{key}", value=value, message=message(key))
           for key, value in options.items() if key not in allowed]
    if name == "local":
        # The local backend's knobs are objects, not numbers: a dict or a number here would
        # otherwise fail deep inside scoring with an AttributeError.
        from .local import Bm25, Fusion

        for key, kind in (("fusion", Fusion), ("bm25", Bm25)):
            if key in options and not isinstance(options[key], kind):
                bad.append(Violation(path=f"backend_options.{key}", value=options[key],
                                     message=f"must be a rag_rerank.backends.local.{kind.__name__}"))
    if bad:
        raise InputError(bad)


def resolve_embedder(spec: Any, backend: Any = "local", base_url: str | None = None) -> Any:
    """The embedder for `spec`; an `openai` embedder named by string follows an openai backend's
    `base_url`, since the server that chats (vLLM, llama.cpp, Ollama) usually serves embeddings
    too. An Anthropic `base_url` is never an embeddings endpoint, so it is not borrowed; to embed
    elsewhere, pass `get_embedder("openai", base_url=...)`."""
    from ..embed import get_embedder, parse_embedder_spec
    from ..embed.memo import Memo

    follows = isinstance(spec, str) and backend == "openai" and bool(base_url)
    if follows and parse_embedder_spec(spec)[0] == "openai":
        emb = get_embedder(spec, base_url=base_url)
    else:
        emb = get_embedder(spec)
    # A model-backed embedder is shared by the backend (scoring) and the post-pass (MMR): each text
    # is embedded once (`embed/memo.py`). The numpy embedders are cheaper than a lookup.
    if isinstance(spec, str) and parse_embedder_spec(spec)[0] in ("sentence-transformers", "openai"):
        return Memo(emb)
    return emb


def backend_kwargs(backend: Any, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """`backend_options` as keyword arguments; refused with a backend instance, which is already built."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        msg = f"backend_options must be a mapping of option names to values, got {type(options).__name__}"
        raise InputError([Violation(path="backend_options", message=msg)])
    if options and not isinstance(backend, str):
        msg = "backend_options apply to a backend named by string; pass them to make_backend() instead"
        raise InputError([Violation(path="backend_options", message=msg)])
    # make_backend()'s own keywords in here were a TypeError ("got multiple values"), an internal error.
    own = [Violation(path=f"backend_options.{key}", value=None,
                     message=f"give {key} as its own {key}= argument, not in backend_options")
           for key in options if key in ("model", "base_url", "api_key", "embedder")]
    if own:
        raise InputError(own)
    return dict(options)
