"""A frozen dataclass's `__init__` without its per-field `object.__setattr__` (`direct_init`).

Why a module of its own: the per-call values live in several modules, `errors.py` (`Attempt`)
among them, which `models.py` imports; the decorator must sit below all of them. It knows nothing
of the values it is applied to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")
_GENERATED: dict[type, Callable[..., None]] = {}  # each class given a direct __init__: its generated one
_FACTORY = object()  # "no value given" for a field whose default is made by a factory


def direct_init(cls: type[_T]) -> type[_T]:
    """`cls` with a direct `__init__` (`_give_direct_init`) that fills the instance dict key by key."""
    return _give_direct_init(cls, whole=False)


def direct_init_read_often(cls: type[_T]) -> type[_T]:
    """`direct_init` for a value whose fields are read dozens of times a call (`steps.Plan`): its
    instance dict is made whole by one dict display and set at once. CPython 3.11 materialises the
    dict that `direct_init` fills key by key with its keys shared with the class's, and a read of a
    field from such a dict misses the specialised attribute load: about three times the instructions
    per read. Made whole, the dict costs a little more to build (about a fifth) and every read is
    fast: it pays for a value read often, not for one built often and read seldom (`Ranked`)."""
    return _give_direct_init(cls, whole=True)


def _give_direct_init(cls: type[_T], *, whole: bool) -> type[_T]:
    """Give the frozen dataclass `cls` an `__init__` that stores each field straight into the
    instance dict: the generated one's work (the same parameters, defaults, default factories,
    order and `__post_init__`; nothing is checked there either), without its `object.__setattr__`
    call per field, which a frozen dataclass pays to get past its own `__setattr__`. A call builds
    a dozen such values (its plan, calls, outcomes, records, meta): about 0.2 us a field each.
    `inspect.signature(cls)` is unchanged; `generated_init(cls)` is the one it replaces (for the
    test that pins the two alike)."""
    generated = cls.__init__
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    given = [f for f in fields if f.init]
    code = generated.__code__
    if code.co_argcount + code.co_kwonlyargcount != len(given) + 1 or \
            {"self_", "fields_", "_object_setattr", "_FACTORY"} & {f.name for f in fields}:
        raise TypeError(f"direct_init does not handle {cls.__name__}'s fields (an InitVar, a reserved name)")
    env: dict[str, Any] = {"_FACTORY": _FACTORY, "_object_setattr": object.__setattr__}
    params: list[str] = []
    values: list[tuple[str, str]] = []  # (field name, the expression of its value), in field order
    keywords = False
    for f in fields:
        name = f.name
        if f.default is not dataclasses.MISSING:
            env[f"_default_{name}"] = f.default
        if f.default_factory is not dataclasses.MISSING:
            env[f"_factory_{name}"] = f.default_factory
        if not f.init:  # made by its factory; a plain default stays the class attribute, as generated
            if f.default_factory is not dataclasses.MISSING:
                values.append((name, f"_factory_{name}()"))
            continue
        if f.kw_only and not keywords:
            params.append("*")
            keywords = True
        if f.default_factory is not dataclasses.MISSING:
            params.append(f"{name}=_FACTORY")
            values.append((name, f"_factory_{name}() if {name} is _FACTORY else {name}"))
            continue
        params.append(f"{name}=_default_{name}" if f.default is not dataclasses.MISSING else name)
        values.append((name, name))
    if whole:
        body = [f"_object_setattr(self_, '__dict__', {{{', '.join(f'{n!r}: {v}' for n, v in values)}}})"]
    else:
        body = ["fields_ = self_.__dict__", *(f"fields_[{n!r}] = {v}" for n, v in values)]
    if hasattr(cls, "__post_init__"):
        body.append("self_.__post_init__()")
    source = f"def __init__(self_, {', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body)
    exec(source, env)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__wrapped__ = generated  # `inspect.signature` reads the generated one's: callers' tools, the docs
    _GENERATED[cls] = generated
    cls.__init__ = init  # type: ignore[misc]
    return cls


def generated_init(cls: type) -> Callable[..., None]:
    """The dataclass-generated `__init__` that `direct_init` replaced in `cls`."""
    return _GENERATED[cls]


def with_direct_init() -> tuple[type, ...]:
    """Every class `direct_init` has been applied to so far (in this process), for the tests."""
    return tuple(_GENERATED)


__all__ = ["direct_init", "direct_init_read_often", "generated_init", "with_direct_init"]
