"""The registry of backends: each named backend's class, the options it takes, the connection
options it reads and its declared `Capabilities`; `make_backend("openai", model=..., base_url=...)`
and the checks that make a misnamed option an error naming it instead of a TypeError deep inside a
constructor, or an option a backend would silently ignore (`model=` with the local scorer).

What a backend can do is read here only (`capabilities`, `model_of`, `name_of`): a backend instance
declares it; one written before capabilities were declared (a caller's own class) is read here,
once per class, from what it has (`scored`, `cache_identity`, `close`, a `timeout` parameter).
No other module probes a backend (tests/test_factory.py checks the source).

Its own module because every surface builds backends the same way: `rerank()`, batch, eval, the
framework components, Ray, the MCP server and the CLI. Backends are imported when first named, so
`import rag_rerank` loads no SDK and no model.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import InputError, Violation
from ..redaction import display_url
from ..wording import either, near_miss
from .base import Backend, Capabilities
from .common import base_url_problem


@dataclass(frozen=True)
class BackendSpec:
    """One named backend: where its class is (imported when first named, so `import rag_rerank`
    loads no SDK and no model), its own options (`backend_options`) and the connection options it
    reads. Its capabilities are its class's `capabilities` (openai's `scored` follows its `scoring`)."""

    name: str
    module: str
    cls: str
    options: tuple[str, ...]
    connection: tuple[str, ...]

    def load(self) -> Callable[..., Backend]:
        return getattr(importlib.import_module(self.module, __package__), self.cls)  # type: ignore[no-any-return]


_SERVER = ("model", "base_url", "api_key")
REGISTRY: dict[str, BackendSpec] = {spec.name: spec for spec in (
    BackendSpec("local", ".local", "LocalBackend", ("fusion", "bm25"), ()),
    BackendSpec("openai", ".openai", "OpenAIBackend",
                ("timeout", "temperature", "response_format", "seed", "scoring", "http"), _SERVER),
    BackendSpec("anthropic", ".anthropic", "AnthropicBackend", ("timeout", "temperature", "http"), _SERVER),
    BackendSpec("cross-encoder", ".cross_encoder", "CrossEncoderBackend",
                ("batch_size", "device", "max_length", "calibration_factor"), ("model",)),
    BackendSpec("rerank-api", ".rerank_api", "RerankAPIBackend", ("timeout", "max_chars", "score_mapping"),
                _SERVER),
)}
BACKENDS = tuple(REGISTRY)
# Keyword options each named backend takes besides model / base_url / api_key (`backend_options`).
BACKEND_OPTIONS: dict[str, tuple[str, ...]] = {name: spec.options for name, spec in REGISTRY.items()}


def capabilities(backend: Any) -> Capabilities:
    """What `backend` can do: as it declares it, else as read once from its class (module docstring)."""
    declared = getattr(backend, "capabilities", None)
    if isinstance(declared, Capabilities):
        return declared
    return _inferred(type(backend), bool(getattr(backend, "scored", False)))


@lru_cache(maxsize=256)
def _inferred(cls: type, scored: bool) -> Capabilities:
    """The capabilities of a backend class that does not declare them, from what it has."""
    return Capabilities(scored=scored, cacheable=callable(getattr(cls, "cache_identity", None)),
                        timeout=_takes_timeout(getattr(cls, "complete", None)),
                        closes=callable(getattr(cls, "close", None)))


def _takes_timeout(complete: Any) -> bool:
    """Whether `complete` takes a `timeout` keyword (a backend written before it existed is called
    without one: it cannot be cut in a synchronous call)."""
    try:
        params = inspect.signature(complete).parameters
    except (TypeError, ValueError):
        return False
    return "timeout" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def model_of(backend: Any, default: Any = None) -> Any:
    """The model `backend` calls (None for one that names none)."""
    return getattr(backend, "model", default)


def is_backend(value: Any) -> bool:
    """Whether `value` can serve as a backend: it has the protocol's two calls (`complete`,
    `acomplete`); for a caller's own object given where a backend is taken (a fallback step)."""
    return callable(getattr(value, "complete", None)) and callable(getattr(value, "acomplete", None))


def name_of(backend: Any) -> str:
    """`backend`'s name: its `name`, else its class's."""
    return str(getattr(backend, "name", type(backend).__name__))


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
    spec = REGISTRY.get(name)
    if spec is not None:
        unused = unused_option_violations(name, model=model, base_url=base_url, api_key=api_key)
        if unused:
            raise InputError(unused)
        if "base_url" in spec.connection and base_url is not None and (problem := base_url_problem(base_url)):
            raise InputError([Violation(path="base_url", message=problem, value=display_url(base_url))])
        check_backend_options(name, kw)
        given = {"model": model, "base_url": base_url, "api_key": api_key}
        connection = {key: given[key] for key in spec.connection}
        return spec.load()(**connection, **({"embedder": embedder} if name == "local" else {}), **kw)
    raise InputError(
        [
            Violation(
                path="backend",
                message=f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}",
                value=name,
            )
        ]
    )


def unused_option_violations(name: str, *, model: Any = None, base_url: Any = None,
                             api_key: Any = None, hints: Mapping[str, str] | None = None) -> list[Violation]:
    """One violation per connection option (`model`, `base_url`, `api_key`) given to a named backend
    that does not read it: `rerank(q, chunks, model="gpt-4o-mini")` without `backend="openai"`
    would otherwise rank with the local scorer, silently (the CLI refuses `-m` with this same check).
    `hints` replace the advice a message ends with, per option (the CLI names its flags)."""
    spec = REGISTRY.get(name)
    if spec is None:
        return []
    takes = spec.connection
    given = {"model": model, "base_url": base_url, "api_key": api_key}
    readers = {key: either([n for n, s in REGISTRY.items() if key in s.connection]) for key in given}
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
