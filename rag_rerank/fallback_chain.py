"""The `fallback=` option: which scorers answer a call after the session's backend failed, in order.

`fallback` is None (a failure is raised), `"local"` (the local backend, as always), or a list of
steps tried one after another for the call that failed (per window and for the final pass when
the request is ranked in windows, not for the whole query): `"local"`, `"cross-encoder:MODEL"` (a
cross-encoder from a local folder or a Hugging Face name, built on first use and kept by the
session), a backend instance the caller built,
and `"input"` (the caller's first-stage order, `backends/input_order.py`), which cannot fail and
therefore may only come last. Each step tried is a `CallRecord` of the call (`meta.fallback_steps`,
`meta.status`, one span each).

The option is checked once here for every surface (library, CLI, batch lines, the framework
components, the MCP server), so a misspelt step is the same error everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .backends.factory import is_backend, name_of
from .errors import InputError, Violation
from .wording import near_miss

# Steps named by string (the cross-encoder with its model: "cross-encoder:MODEL"). Backends that
# need a server or a key (openai, anthropic, rerank-api) are passed as instances: a name alone
# would not say which server.
STEP_NAMES = ("local", "cross-encoder", "input")
LAST_RESORT = "input"
SHOWN = "local, cross-encoder:MODEL, input"  # the steps as messages list them

Step = Any  # a name of STEP_NAMES or a Backend instance


CROSS_ENCODER = "cross-encoder"


def step_name(step: Step) -> str:
    """How a step is named in meta, spans and logs: its scorer's name (`cross-encoder` for
    `cross-encoder:MODEL`), or the backend instance's `name`."""
    if isinstance(step, str):
        return step.partition(":")[0]
    return name_of(step)


def parse_steps(text: str) -> str | list[str]:
    """A chain written as text (`--fallback cross-encoder:MODEL,local,input`, an environment variable):
    one step as its name, several as a list; checked by `as_chain` where it is used."""
    steps = [s.strip() for s in text.split(",")]
    return steps[0] if len(steps) == 1 else steps


def as_chain(value: Any) -> tuple[Step, ...]:
    """The steps of a `fallback=` value, in order (`()` for None), or one `InputError` naming every
    problem: an unknown step (with a did-you-mean), a step twice, `"input"` before the end, an
    object that is no backend, an empty list."""
    if value is None:
        return ()
    if isinstance(value, str):
        steps: Sequence[Any] = [value]
    elif isinstance(value, (list, tuple)):
        steps = value
    else:
        raise InputError([Violation(path="fallback", value=repr(value), message=(
            f"fallback must be None, a step name or a list of steps ({SHOWN}, or a backend "
            f"instance), got {type(value).__name__}"))])
    problems: list[Violation] = []
    if not steps:
        problems.append(Violation(path="fallback", value="[]", message=(
            f"fallback is an empty list; leave it unset (None) for no fallback, or name a step: {SHOWN}")))
    seen: set[str] = set()
    for i, step in enumerate(steps):
        where = f"fallback[{i}]" if not isinstance(value, str) else "fallback"
        if isinstance(step, str):
            name, _, model = step.partition(":")
            if name == CROSS_ENCODER and not model.strip():
                problems.append(Violation(path=where, value=step, message=(
                    "the cross-encoder step needs its model: 'cross-encoder:MODEL' (a local folder or a "
                    "Hugging Face name)")))
                continue
            if name != CROSS_ENCODER and step not in STEP_NAMES:
                problems.append(Violation(path=where, value=step, message=(
                    f"unknown fallback step {step!r}{near_miss(step, STEP_NAMES)} (steps: {SHOWN}, or a "
                    "backend instance for a server-backed scorer)")))
                continue
        elif not is_backend(step):
            problems.append(Violation(path=where, value=repr(step)[:80], message=(
                f"a fallback step must be one of {SHOWN} or a backend instance (with "
                f"complete and acomplete), got {type(step).__name__}")))
            continue
        name = step_name(step)
        if name in seen:
            problems.append(Violation(path=where, value=name,
                                      message=f"fallback step {name!r} is listed twice"))
        seen.add(name)
        if step == LAST_RESORT and i != len(steps) - 1:
            problems.append(Violation(path=where, value=step, message=(
                "'input' (the first-stage order) cannot fail, so the steps after it would never run: "
                "put it last")))
    if problems:
        raise InputError(problems)
    return tuple(steps)


def build_step(step: Step, embedder: Any) -> Any:
    """The backend a step names: `local` scoring with `embedder` (the request's, or the lexical one
    after the embedder failed), a new cross-encoder of the named model, the first-stage order; an
    instance as it is.
    The engine keeps what is costly to build (`Setup.fallbacks`)."""
    if not isinstance(step, str):
        return step
    if step == LAST_RESORT:
        from .backends.input_order import InputOrderBackend

        return InputOrderBackend()
    from .backends.factory import make_backend

    if step == "local":
        return make_backend(step, embedder=embedder)
    return make_backend(CROSS_ENCODER, model=step.partition(":")[2].strip())


__all__ = ["CROSS_ENCODER", "LAST_RESORT", "SHOWN", "STEP_NAMES", "Step", "as_chain", "build_step",
           "parse_steps", "step_name"]
