"""The service's configuration: which `model` names a client may ask for and what each one is, the
API keys and their daily budgets, the limits, CORS. Read once at start-up from a YAML or JSON file
(`rag-rerank serve --config FILE`); every problem in it is reported at once, naming the key at fault.

Why a file and not request fields. A RAG stack that speaks Cohere's rerank API sends `model`,
`query`, `documents` and `top_n` and nothing else, so what a request cannot say (the backend, its
model, windows, the cache, budgets, the minimum score, lambda, calibration) is the operator's to
choose per model name. Each entry becomes one `Reranker` session (`app.py`); its options are checked
with the library's own lists (`options.split_options` / `check_names`), so an option the library gains
is accepted here without a change.

    models:
      local: {backend: local}                 # the offline default, also what no config gives
      gpt:
        backend: openai
        model: gpt-4o-mini
        base_url: https://api.openai.com/v1
        api_key_env: OPENAI_API_KEY            # the upstream key is read from the environment
        cache: true                            # shared by every worker (SQLite)
        options: {fallback: local, top_k: 5, lambda: 0.7, window_size: 20,
                  prices: {input: 0.15, output: 0.6}}
    keys:                                      # none: no authentication
      - {name: team-a, sha256: 9f86d08..., budget: {max_requests: 10000, max_tokens: 2000000}}
    limits: {max_in_flight: 32, max_queue: 64, deadline_s: 60, max_documents: 1000}
    cors: {allow_origins: ["https://app.example.com"]}
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..cost import Budget, as_budget, as_prices
from ..errors import ConfigError, InputError, Violation
from ..guard.input import lambda_violations, normal_top_k, top_k_violations
from ..guard.limits import load_limits
from ..options import REQUEST_OPTIONS, SESSION_OPTIONS, Options, check_names, option_violations, split_options
from ..retry import RetryPolicy
from ..session import Reranker

DEFAULT_MODEL = "local"
# A session option the service sets itself (keys come from the environment, never from a file).
MODEL_KEYS = (
    "backend",
    "model",
    "base_url",
    "api_key_env",
    "embedder",
    "backend_options",
    "cache",
    "options",
)
_DIGEST = re.compile(r"(?:sha256:)?([0-9a-fA-F]{64})")


@dataclass(frozen=True)
class ModelSpec:
    """One model name a client may send: the `Reranker` keywords it is built with.

    `session` holds the session options (backend, model, base_url, embedder, backend_options, cache);
    `defaults` the request options every request to this name runs with. `api_key_env` names the
    environment variable holding the upstream key (a key is never written in the file)."""

    name: str
    session: Mapping[str, Any]
    defaults: Mapping[str, Any]
    api_key_env: str | None = None

    def reranker_kwargs(self) -> dict[str, Any]:
        """The keywords of `Reranker(...)` for this model (the upstream key read now)."""
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return {**self.session, **({"api_key": key} if key else {}), **self.defaults}

    def describe(self) -> dict[str, Any]:
        """What `GET /v1/models` shows: the name and the backend, never a URL or a key."""
        backend = self.session.get("backend", "local")
        return {
            "name": self.name,
            "backend": backend if isinstance(backend, str) else type(backend).__name__,
            "model": self.session.get("model"),
            "endpoints": ["rerank"],
        }


@dataclass(frozen=True)
class KeyBudget:
    """What one API key may spend per UTC day: service requests (`max_requests`), and the library's
    `Budget` over backend calls, tokens and cost (`cost.py`). None: no limit."""

    max_requests: int | None = None
    spend: Budget | None = None

    def __bool__(self) -> bool:
        return self.max_requests is not None or bool(self.spend)


@dataclass(frozen=True)
class ApiKey:
    """One accepted bearer key, held only as its SHA-256 digest; `name` labels it in logs and
    metrics (the key itself is never logged or echoed)."""

    digest: bytes
    name: str
    budget: KeyBudget = field(default_factory=KeyBudget)

    @property
    def ident(self) -> str:
        """A short, stable id for the ledger and the logs: the name, or the digest's first hex."""
        return self.name or self.digest.hex()[:12]


@dataclass(frozen=True)
class Limits:
    """The service's own bounds (per worker process for the in-flight ones).

    `max_in_flight` requests are reranked at once, `max_queue` more wait (each at most
    `queue_timeout_s`); beyond that a request gets 429 with `Retry-After: retry_after_s`.
    `deadline_s` bounds one request from arrival to answer (504 when crossed); `drain_s` how long
    SIGTERM waits for the requests in flight. A body over `max_body_bytes` is refused with 413; more than
    `max_documents` documents, a document over `max_document_chars` or a query over
    `max_query_chars` with 400 naming the index and the limit."""

    max_body_bytes: int = 4_000_000
    max_documents: int = 1000
    max_document_chars: int = 40_000
    max_query_chars: int = 4000
    max_in_flight: int = 32
    max_queue: int = 128
    queue_timeout_s: float = 10.0
    deadline_s: float = 60.0
    retry_after_s: int = 1
    drain_s: float = 30.0


@dataclass(frozen=True)
class ServiceConfig:
    """The whole configuration (module docstring). `ledger` is the SQLite file the per-key daily
    spending is kept in (shared by every worker); None when no key has a budget."""

    models: Mapping[str, ModelSpec]
    default_model: str = DEFAULT_MODEL
    keys: tuple[ApiKey, ...] = ()
    limits: Limits = field(default_factory=Limits)
    cors_origins: tuple[str, ...] = ()
    ledger: str | None = None

    @property
    def auth(self) -> bool:
        return bool(self.keys)

    def with_keys(self, keys: Sequence[ApiKey]) -> ServiceConfig:
        """This configuration with more keys (`--api-keys-file`); a digest given twice is kept once."""
        seen = {k.digest for k in self.keys}
        extra = tuple(k for k in keys if k.digest not in seen)
        return ServiceConfig(
            self.models, self.default_model, self.keys + extra, self.limits, self.cors_origins, self.ledger
        )


def default_config() -> ServiceConfig:
    """No config file: the offline default backend under the model name `local`."""
    return ServiceConfig(models={DEFAULT_MODEL: model_spec(DEFAULT_MODEL, {}, [])})


def load_config(path: str | os.PathLike[str] | None) -> ServiceConfig:
    """The configuration in `path` (YAML or JSON), or the default when None; an `InputError`
    naming every problem (the file, the key path, what is wrong)."""
    if path is None:
        return default_config()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(
            [Violation(path=str(p), message=f"cannot read the config file: {exc.strerror or exc}")],
            headline="invalid service config",
        ) from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise InputError(
            [
                Violation(
                    path=str(p),
                    message=f"not valid {'JSON' if p.suffix == '.json' else 'YAML'}"
                    f": {str(exc).splitlines()[0][:200]}",
                )
            ],
            headline="invalid service config",
        ) from None
    return parse_config(data if data is not None else {}, base=p.parent)


def parse_config(data: Any, base: Path | None = None) -> ServiceConfig:
    """A configuration from its mapping (what `load_config` read); every problem at once."""
    bad: list[Violation] = []
    if not isinstance(data, Mapping):
        raise InputError(
            [
                Violation(
                    path="config",
                    message="the config must be a mapping with 'models', 'keys', 'limits', 'cors'",
                )
            ],
            headline="invalid service config",
        )
    check_keys(data, ("models", "default_model", "keys", "limits", "cors", "ledger"), "", bad)
    raw_models = data.get("models") or {DEFAULT_MODEL: {}}
    models: dict[str, ModelSpec] = {}
    if not isinstance(raw_models, Mapping):
        bad.append(Violation(path="models", message="must map each model name to its settings"))
    else:
        for name, entry in raw_models.items():
            if not isinstance(entry, Mapping):
                bad.append(
                    Violation(path=f"models.{name}", message="must be a mapping (backend, model, options...)")
                )
                continue
            models[str(name)] = model_spec(str(name), entry, bad, base)
    default = data.get("default_model", DEFAULT_MODEL if DEFAULT_MODEL in models else next(iter(models), ""))
    if models and default not in models:
        bad.append(
            Violation(
                path="default_model",
                value=default,
                message=f"names no configured model (configured: {', '.join(models)})",
            )
        )
    keys = tuple(parse_keys(data.get("keys") or [], bad))
    limits = parse_limits(data.get("limits") or {}, bad)
    cors = data.get("cors") or {}
    origins: tuple[str, ...] = ()
    if isinstance(cors, Mapping):
        check_keys(cors, ("allow_origins",), "cors.", bad)
        raw = cors.get("allow_origins") or []
        if isinstance(raw, list) and all(isinstance(o, str) for o in raw):
            origins = tuple(raw)
        else:
            bad.append(Violation(path="cors.allow_origins", message="must be a list of origins"))
    else:
        bad.append(Violation(path="cors", message="must be a mapping {allow_origins: [...]}"))
    if any(k.budget.spend and k.budget.spend.max_cost is not None for k in keys):
        for spec in models.values():
            if spec.defaults.get("prices") is None:
                bad.append(
                    Violation(
                        path=f"models.{spec.name}.options.prices",
                        message="a key has a max_cost budget: every model needs prices "
                        "(per million input and output tokens) to count it",
                    )
                )
    ledger = data.get("ledger")
    if ledger is not None and not isinstance(ledger, str):
        bad.append(Violation(path="ledger", message="must be a file path"))
    if bad:
        # The file is refused: what building each model would find is named too, in the same
        # report (its backend, embedder, upstream key; without its cache, so nothing is created).
        sessions, more = build_sessions(models, probe=True)
        for session in sessions.values():
            session.close()
        seen = {(v.path, v.message) for v in bad}
        bad.extend(v for v in more if (v.path, v.message) not in seen)
        raise InputError(bad, headline="invalid service config")
    return ServiceConfig(
        models=models,
        default_model=str(default),
        keys=keys,
        limits=limits,
        cors_origins=origins,
        ledger=ledger,
    )


def build_sessions(
    models: Mapping[str, ModelSpec], *, probe: bool = False
) -> tuple[dict[str, Reranker], list[Violation]]:
    """Each model's `Reranker` session, and what building them found, every model's problems at
    once under its path (`models.gpt.base_url`; a missing upstream key as `models.gpt`). A `probe`
    builds only what a session is made of (backend, embedder, key): no cache, no request options."""
    sessions: dict[str, Reranker] = {}
    bad: list[Violation] = []
    for name, spec in models.items():
        kwargs = spec.reranker_kwargs()
        if probe:
            kwargs = {k: v for k, v in kwargs.items() if k in SESSION_OPTIONS and k != "cache"}
        try:
            sessions[name] = Reranker(**kwargs)
        except InputError as exc:
            for v in exc.violations:
                bad.append(Violation(path=f"models.{name}.{v.path}", value=v.value, message=v.message))
        except ConfigError as exc:
            bad.append(Violation(path=f"models.{name}", message=str(exc)))
    return sessions, bad


def check_keys(data: Mapping[str, Any], allowed: Sequence[str], prefix: str, bad: list[Violation]) -> None:
    """A violation for each key of `data` not in `allowed` (with what is allowed)."""
    bad.extend(
        Violation(path=f"{prefix}{k}", message=f"unknown key (allowed: {', '.join(allowed)})")
        for k in data
        if k not in allowed
    )


def model_spec(
    name: str, entry: Mapping[str, Any], bad: list[Violation], base: Path | None = None
) -> ModelSpec:
    """One `models.NAME` entry as a `ModelSpec`; its problems appended to `bad`."""
    where = f"models.{name}"
    check_keys(entry, MODEL_KEYS, f"{where}.", bad)
    session = {k: v for k, v in entry.items() if k in SESSION_OPTIONS}
    try:
        split_options(session)
    except InputError as exc:
        bad.extend(Violation(path=f"{where}.{v.path}", message=v.message) for v in exc.violations)
    if (
        isinstance(session.get("cache"), str)
        and base is not None
        and not Path(session["cache"]).is_absolute()
    ):
        session["cache"] = str(base / session["cache"])
    env = entry.get("api_key_env")
    if env is not None and not isinstance(env, str):
        bad.append(Violation(path=f"{where}.api_key_env", message="must name an environment variable"))
        env = None
    raw = entry.get("options") or {}
    defaults: dict[str, Any] = {}
    if not isinstance(raw, Mapping):
        bad.append(Violation(path=f"{where}.options", message="must be a mapping of request options"))
    else:
        defaults = {("lambda_" if k == "lambda" else str(k)): v for k, v in raw.items()}
        try:
            check_names(defaults, REQUEST_OPTIONS)
        except InputError as exc:
            bad.extend(Violation(path=f"{where}.options.{v.path}", message=v.message) for v in exc.violations)
            defaults = {k: v for k, v in defaults.items() if k in REQUEST_OPTIONS}
        if isinstance(defaults.get("policy"), Mapping):
            try:
                defaults["policy"] = RetryPolicy(**defaults["policy"])
            except (TypeError, InputError) as exc:
                bad.append(Violation(path=f"{where}.options.policy", message=str(exc).splitlines()[0]))
        if isinstance(defaults.get("calibration"), str) and base is not None:
            path = Path(defaults["calibration"])
            defaults["calibration"] = str(path if path.is_absolute() else base / path)
        for v in option_value_violations(defaults):
            path = f"{where}.options.{option_name(v.path)}"
            bad.append(Violation(path=path, value=v.value, message=yaml_words(v.message)))
    # More documents than one prompt takes are ranked in windows, as the library does when asked:
    # the operator's window_size, else the largest one prompt takes (a request within it is one call).
    defaults.setdefault("window_size", load_limits().max_chunks)
    return ModelSpec(name=name, session=session, defaults=defaults, api_key_env=env)


def option_value_violations(defaults: Mapping[str, Any]) -> list[Violation]:
    """What is wrong with a model's request options on their own, by the library's rules: each
    option's check in the options table (`options.option_violations`, what a session checks when
    built) and `top_k` and `lambda` (the input guard's checks; the table leaves them to the request,
    where a bad default would blame every client for the operator's file)."""
    out = option_violations(Options(**defaults))
    if "top_k" in defaults:
        out.extend(top_k_violations(normal_top_k(defaults["top_k"])))
    if "lambda_" in defaults:
        out.extend(lambda_violations(defaults["lambda_"]))
    return out


def option_name(path: str) -> str:
    """A library option's path as the config file spells it (`lambda_` is `lambda` there)."""
    return re.sub(r"^lambda_?\b", "lambda", path)


def yaml_words(message: str) -> str:
    """A library message in the config file's words: Python's `None` is YAML's and JSON's `null`."""
    return re.sub(r"\bNone\b", "null", message)


def key_digest(text: str) -> bytes:
    """The SHA-256 digest a key line stands for: `sha256:HEX` or 64 hex digits are a digest given
    as is, anything else is the key itself (hashed here; only the digest is kept)."""
    text = text.strip()
    match = _DIGEST.fullmatch(text)
    if match:
        return bytes.fromhex(match.group(1))
    return hashlib.sha256(text.encode("utf-8")).digest()


def parse_keys(raw: Any, bad: list[Violation], where: str = "keys") -> list[ApiKey]:
    """The `keys:` list: each `{key | sha256, name?, budget?}`."""
    if not isinstance(raw, list):
        bad.append(Violation(path=where, message="must be a list of {key or sha256, name?, budget?}"))
        return []
    out = []
    for i, item in enumerate(raw):
        path = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            bad.append(Violation(path=path, message="must be a mapping {key or sha256, name?, budget?}"))
            continue
        check_keys(item, ("key", "sha256", "name", "budget"), f"{path}.", bad)
        secret = item.get("key", item.get("sha256"))
        if not isinstance(secret, str) or not secret.strip() or ("key" in item) == ("sha256" in item):
            bad.append(
                Violation(path=path, message="needs exactly one of key (the key) or sha256 (its hex digest)")
            )
            continue
        if "sha256" in item and not _DIGEST.fullmatch(secret.strip()):
            bad.append(Violation(path=f"{path}.sha256", message="must be 64 hex digits"))
            continue
        name = item.get("name") or ""
        if not isinstance(name, str):
            bad.append(Violation(path=f"{path}.name", message="must be a string"))
            name = ""
        digest = key_digest(secret) if "sha256" in item else hashlib.sha256(secret.strip().encode()).digest()
        out.append(
            ApiKey(digest=digest, name=name, budget=parse_budget(item.get("budget"), f"{path}.budget", bad))
        )
    return out


def parse_budget(raw: Any, path: str, bad: list[Violation]) -> KeyBudget:
    """A key's daily budget `{max_requests?, max_calls?, max_tokens?, max_cost?}`."""
    if raw is None:
        return KeyBudget()
    if not isinstance(raw, Mapping):
        bad.append(
            Violation(path=path, message="must be {max_requests?, max_calls?, max_tokens?, max_cost?}")
        )
        return KeyBudget()
    requests = raw.get("max_requests")
    if requests is not None and (isinstance(requests, bool) or not isinstance(requests, int) or requests < 0):
        bad.append(Violation(path=f"{path}.max_requests", value=requests, message="must be an int >= 0"))
        requests = None
    spend_fields = {k: v for k, v in raw.items() if k != "max_requests"}
    spend = None
    if spend_fields:
        try:
            # Prices are each model's; a placeholder lets a cost limit through the check here
            # (parse_config requires every model to have prices when one is set).
            spend = as_budget(spend_fields, as_prices({"input": 0, "output": 0}), path)
        except InputError as exc:
            bad.extend(exc.violations)
    return KeyBudget(max_requests=requests, spend=spend)


def parse_limits(raw: Any, bad: list[Violation]) -> Limits:
    """The `limits:` mapping over the defaults of `Limits`; each value a positive number."""
    if not isinstance(raw, Mapping):
        bad.append(Violation(path="limits", message="must be a mapping"))
        return Limits()
    defaults = Limits()
    names = tuple(defaults.__dataclass_fields__)
    check_keys(raw, names, "limits.", bad)
    values: dict[str, Any] = {}
    for name in names:
        if name not in raw:
            continue
        v, kind = raw[name], type(getattr(defaults, name))
        ok = (
            not isinstance(v, bool)
            and isinstance(v, (int, float))
            and v > 0
            and (kind is float or float(v).is_integer())
        )
        if name == "max_queue":
            ok = not isinstance(v, bool) and isinstance(v, int) and v >= 0
        if not ok:
            bad.append(
                Violation(
                    path=f"limits.{name}",
                    value=v,
                    message=f"must be {'a number' if kind is float else 'an int'} > 0"
                    if name != "max_queue"
                    else "must be an int >= 0",
                )
            )
            continue
        values[name] = kind(v)
    return Limits(**values)


def read_keys_file(path: str | os.PathLike[str]) -> list[ApiKey]:
    """`--api-keys-file`: one key, or its SHA-256 hex (`sha256:HEX` or 64 hex digits), per line;
    blank lines and `#` comments skipped. An unreadable file is an `InputError` naming it."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            [Violation(path=str(path), message=f"cannot read the API keys file: {exc}")],
            headline="invalid API keys file",
        ) from None
    keys = [
        ApiKey(digest=key_digest(line), name=f"{Path(path).name}:{n}")
        for n, line in enumerate(lines, 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not keys:
        raise InputError(
            [Violation(path=str(path), message="holds no key (one key or SHA-256 hex per line)")],
            headline="invalid API keys file",
        )
    return keys


__all__ = [
    "DEFAULT_MODEL",
    "ApiKey",
    "KeyBudget",
    "Limits",
    "ModelSpec",
    "ServiceConfig",
    "default_config",
    "key_digest",
    "load_config",
    "parse_config",
    "read_keys_file",
]
