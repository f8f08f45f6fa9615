"""The exceptions rag-rerank raises, each carrying what a caller needs to act on it.

Guards never stop at the first problem: an `InputError` or `OutputError` carries every
`Violation`, so a CLI can print them all and a re-ask can quote them all to the model.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .frozen import direct_init


@dataclass(frozen=True)
class Violation:
    """One broken rule: where (a JSON path, a line, an id), what value, and why."""

    path: str
    message: str
    value: Any = None
    line: int | None = None
    id: str | None = None

    def __str__(self) -> str:
        where = []
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.path:
            where.append(self.path)
        if self.id is not None:
            where.append(f"id {self.id!r}")
        prefix = ": ".join(where)
        return f"{prefix}: {self.message}" if prefix else self.message

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "message": self.message}
        if self.line is not None:
            out["line"] = self.line
        if self.id is not None:
            out["id"] = self.id
        return out


def whole_argument_first(violations: Sequence[Violation]) -> list[Violation]:
    """Problems with a whole argument (a size limit, duplicate ids, a bad `top_k`) before
    per-record ones, each group in its original order: fixing those usually fixes the rest, so a
    list cut short for a terminal or a model's context must not hide them."""
    return sorted(violations, key=lambda v: "[" in v.path)


class RerankError(Exception):
    """Base class of every error rag-rerank raises on purpose."""


class _ViolationsError(RerankError):
    def __init__(self, violations: Iterable[Violation], headline: str) -> None:
        self.violations: tuple[Violation, ...] = tuple(violations)
        self.headline = headline
        super().__init__(self._text())

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its data, not from its message: a worker pool pickles an error to re-raise it
        # in the parent, and Exception's default rebuilt it as `cls(message)`, so the violations
        # became the message's characters ("invalid input (161 problems)").
        data = (type(self), _picklable(self.violations), self.headline, getattr(self, "raw", None))
        return (_rebuild, data, _state(self))

    def _text(self) -> str:
        n = len(self.violations)
        lines = [f"{self.headline} ({n} problem{'s' if n != 1 else ''})"]
        lines += [f"  - {v}" for v in self.violations]
        return "\n".join(lines)


class InputError(_ViolationsError):
    """The caller's query, chunks or parameters break the input contract (CLI exit 2)."""

    def __init__(self, violations: Iterable[Violation], headline: str = "invalid input") -> None:
        super().__init__(violations, headline)


class OutputError(_ViolationsError):
    """A raw LLM output breaks the output contract (CLI `check` exit 1)."""

    def __init__(
        self,
        violations: Iterable[Violation],
        raw: str = "",
        headline: str = "invalid LLM output",
    ) -> None:
        self.raw = raw
        super().__init__(violations, headline)


@direct_init  # every call records one (`retry.py`): built without a setattr per field
@dataclass(frozen=True)
class Attempt:
    """What one call to a backend did, kept so a final failure can show the whole story."""

    number: int
    kind: str  # "ok", "transient", "invalid_output", "truncated", "fatal"
    detail: str
    wait_s: float = 0.0
    violations: Sequence[Violation] = field(default_factory=tuple)
    # When it ran (`time.time_ns()`, the clock spans use) and what the answer said about itself: the
    # facts an LLM request's span and log line carry (`observe.py`), without its text.
    start_ns: int = 0
    end_ns: int = 0
    usage: Mapping[str, int] = field(default_factory=dict)
    model: str | None = None
    finish_reason: str | None = None
    error_type: str | None = None  # the backend failure's class (`RateLimit...`), for `error.type`
    # The upstream's HTTP status and Retry-After (seconds) of a failed call, when it gave them: what
    # a gateway in front of the backend (the service, `service/protocol.py`) answers its client with.
    status: int | None = None
    retry_after: float | None = None


class BackendError(RerankError):
    """Every attempt to get a valid answer from a backend failed (CLI exit 3)."""

    def __init__(self, message: str, attempts: Sequence[Attempt] = (),
                 usage: Mapping[str, int] | None = None, *, refused: bool = False) -> None:
        self.message = message
        self.attempts: tuple[Attempt, ...] = tuple(attempts)
        # The budget refused the next request (`cost.Spending`): no request was sent for it.
        self.refused = refused
        # Tokens the failed attempts still consumed (billed): a fallback's meta.usage adds them.
        self.usage: dict[str, int] = dict(usage or {})
        detail = "; ".join(_attempt_runs(self.attempts))
        super().__init__(f"{message}" + (f" [{detail}]" if detail else ""))

    def __reduce__(self) -> tuple[Any, ...]:
        # From its parts (a worker pool re-raises it in the parent): `cls(str(self))` would lose the
        # attempts' kinds and waits, which decide what the caller does next.
        attempts = tuple(replace(a, violations=_picklable(a.violations)) for a in self.attempts)
        return (type(self), (self.message, attempts, self.usage), _state(self))


class EmbedderError(BackendError):
    """An embedder that calls a server (`openai[:MODEL]`) got no usable vectors from it (CLI exit 3,
    like a backend failure). Its own class because it is not the ranking backend that failed:
    with `fallback="local"` the pipeline then compares lexical vectors instead (`meta.embedder_fallback`),
    and keeps an LLM's ranking it already has."""


def _picklable(violations: Iterable[Violation]) -> tuple[Violation, ...]:
    """`violations` with any value that cannot be pickled (a lock, a generator the caller passed as
    chunks) replaced by its repr: the error must still reach the parent process, with its text."""
    out = []
    for v in violations:
        try:
            pickle.dumps(v.value)
        except Exception:
            v = replace(v, value=repr(v.value))
        out.append(v)
    return tuple(out)


def _state(error: BaseException) -> dict[str, Any] | None:
    """What a caller attached besides the constructor's data (`__notes__`, own attributes)."""
    return {k: v for k, v in vars(error).items() if k not in _REBUILT} or None


_REBUILT = frozenset({"violations", "headline", "raw", "message", "attempts", "usage", "feature", "extra",
                      "module"})


def _rebuild(cls: type[_ViolationsError], violations: tuple[Violation, ...], headline: str,
             raw: str | None) -> _ViolationsError:
    if raw is not None:
        return cls(violations, raw=raw, headline=headline)  # type: ignore[call-arg]
    return cls(violations, headline=headline)  # type: ignore[call-arg]


def _attempt_runs(attempts: Sequence[Attempt]) -> list[str]:
    """`#1 kind: detail`, with a run of attempts that failed alike as one `#1-#6 kind: detail`: six
    copies of the same 300-character error page made the one line unreadable."""
    runs: list[list[Attempt]] = []
    for a in attempts:
        if runs and (runs[-1][-1].kind, runs[-1][-1].detail) == (a.kind, a.detail):
            runs[-1].append(a)
        else:
            runs.append([a])
    return [f"#{run[0].number}" + (f"-#{run[-1].number}" if len(run) > 1 else "") + f" {run[0].kind}: "
            f"{run[0].detail}" for run in runs]


class BackendFailure(RerankError):
    """Raised by a backend for one failed call, already classified."""

    kind = "fatal"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class TransientFailure(BackendFailure):
    """Rate limit, 5xx, overloaded, timeout, connection reset: worth a backoff and another try."""

    kind = "transient"

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message, status=status)


class FatalFailure(BackendFailure):
    """Auth, bad request, refusal, missing model: retrying cannot help, fail fast."""

    kind = "fatal"


class UnreachableFailure(FatalFailure):
    """Nothing to talk to: the connection was refused (nothing listens on that port) or the host
    name does not resolve. A server being started, a wrong port or a typo in the URL does not
    change in the seconds a backoff waits, so this fails fast (`fallback="local"` answers at once)
    instead of six transient attempts over 18 s. A timeout or a dropped connection, where a
    server is there, stays a `TransientFailure`."""


class InternalError(RuntimeError):
    """A promise the code makes to itself was broken: a bug in rag-rerank, not the caller's input
    or a backend's failure. Deliberately not a `RerankError` (batch files it as `internal`, the CLI
    exits 4). Raised, for one, when a scored backend (whose answers pass the output guard by
    construction, `backends/scored.py`) writes an answer the guard refuses: re-asking a
    deterministic scorer could only repeat it, so it fails at once with the guard's findings."""

    def __init__(self, message: str, violations: Sequence[Violation] = ()) -> None:
        self.message = message
        self.violations: tuple[Violation, ...] = tuple(violations)
        shown = "; ".join(str(v) for v in self.violations[:3])
        super().__init__(f"{message}{': ' + shown if shown else ''} (a bug in rag-rerank; please report it)")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.violations))


class UsageError(RerankError):
    """A command line that cannot be acted on: a missing file, a bad option value (CLI exit 2)."""


class ConfigError(RerankError):
    """The set-up cannot work, so nothing was attempted: no API key for a remote service
    (CLI exit 2, like bad input; a backend failure, exit 3, means a call was made and failed)."""


class BudgetError(RerankError):
    """A rerank or a batch would spend more than its `budget=` allows, so no request was made
    (CLI exit 2). `limits` names each limit crossed, `plan` is the plan that crossed them
    (`CostPlan.to_dict()`)."""

    def __init__(self, message: str, limits: Sequence[str] = (),
                 plan: Mapping[str, Any] | None = None) -> None:
        self.message = message
        self.limits: tuple[str, ...] = tuple(limits)
        self.plan: dict[str, Any] = dict(plan or {})
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.limits, self.plan))


class CacheMissError(RerankError):
    """Replay mode (`ResponseCache(replay=True)`, CLI `--replay`) found no stored answer for a call:
    the pipeline asks something it did not ask when the answers were recorded (CLI exit 3). `key`
    is the call's cache key; `what` says which call (the backend and model, a window)."""

    def __init__(self, what: str, key: str) -> None:
        self.what, self.key = what, key
        super().__init__(f"replay: no cached answer for {what} (key {key[:16]}); the call differs from every "
                         "recorded one (a changed chunk, option, prompt or model); record it again "
                         "without replay")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.what, self.key))


class MissingDependencyError(RerankError, ImportError):
    """A package is needed for what was asked; the message says what to install.

    Also an `ImportError`, so the usual optional-import idiom works for our integrations:
    `try: from rag_rerank.integrations.langchain import RagRerankCompressor` / `except ImportError:`.

    `extra` names the optional extra in pyproject.toml that brings it. `extra=None` is for a core
    dependency (openai, anthropic) missing from a broken environment: there is no extra to name,
    and `pip install 'rag-rerank[openai]'` would only warn that no such extra exists.
    """

    def __init__(self, feature: str, extra: str | None, module: str) -> None:
        self.feature, self.extra, self.module = feature, extra, module
        if extra is None:
            super().__init__(
                f"{feature} needs the package '{module}', a dependency of rag-rerank that is missing "
                f"from this environment: pip install '{module}'"
            )
            return
        # Both spellings: the released package by name, and a source checkout, where the name
        # would fetch the package from PyPI instead of installing the extra into this copy.
        super().__init__(
            f"{feature} needs the optional package '{module}': pip install 'rag-rerank[{extra}]' "
            f"(from a source checkout: pip install '.[{extra}]')"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's default rebuilt it as `cls(message)`, a TypeError while unpickling: raised in a
        # multiprocessing.Pool worker, that killed the pool's result thread and the parent hung.
        return (type(self), (self.feature, self.extra, self.module), _state(self))
