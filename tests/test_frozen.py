"""`direct_init` (rag_rerank/frozen.py): a frozen dataclass's `__init__` without a setattr per
field, making exactly what the generated one made."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_rerank.frozen import generated_init


def _direct_classes() -> tuple[type, ...]:
    """Every class given a direct `__init__`, after importing the modules that declare them."""
    import rag_rerank.engine  # noqa: F401  (imports steps, retry, fallback, options, shortening)
    from rag_rerank.frozen import with_direct_init

    return with_direct_init()


def test_direct_init_is_given_to_the_per_call_values() -> None:
    from rag_rerank.backends.base import Completion
    from rag_rerank.errors import Attempt
    from rag_rerank.fallback import Answer
    from rag_rerank.models import CallRecord, RerankResult, RunMeta
    from rag_rerank.options import Checked
    from rag_rerank.retry import Outcome
    from rag_rerank.shortening import Shortened
    from rag_rerank.steps import Call, Calls, Plan, Work

    assert {Plan, Call, Calls, Work, Outcome, Answer, CallRecord, RunMeta, RerankResult, Checked,
            Shortened, Attempt, Completion} <= set(_direct_classes())


_ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                       st.text(max_size=4), st.tuples(st.integers()),
                       st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.data())
def test_direct_init_makes_what_the_generated_init_made(data: st.DataObject) -> None:
    """`frozen.direct_init` (issue 37: a call builds a dozen frozen values, each field set through
    `object.__setattr__`) stores the same fields, in the same order, with the same defaults and a
    fresh default-factory value per instance, as the dataclass-generated `__init__` it replaced,
    for any values, given by position or by keyword or left out; the signature is unchanged."""
    classes = sorted(_direct_classes(), key=lambda c: c.__qualname__)
    cls = data.draw(st.sampled_from(classes), label="class")
    generated = generated_init(cls)
    assert inspect.signature(cls.__init__) == inspect.signature(generated)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for f in fields.values():
        if not f.init:
            continue
        optional = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if optional and data.draw(st.booleans(), label=f"leave out {f.name}"):
            continue
        value = data.draw(_ANY_VALUE, label=f.name)
        if not kwargs and not f.kw_only and len(args) == list(fields).index(f.name) \
                and data.draw(st.booleans(), label=f"{f.name} by position"):
            args.append(value)
        else:
            kwargs[f.name] = value
    passed = {*list(fields)[:len(args)], *kwargs}
    made = cls(*args, **kwargs)
    expected = object.__new__(cls)
    generated(expected, *args, **kwargs)
    assert list(vars(made)) == list(vars(expected))
    for name, value in vars(expected).items():
        got = vars(made)[name]
        if fields[name].default_factory is not dataclasses.MISSING and name not in passed:
            again = cls(*args, **kwargs)  # a fresh value each time, as the factory makes it
            assert got == value and type(got) is type(value)
            factory = fields[name].default_factory
            if factory() is not factory():  # not a shared immutable value (`tuple()` is one)
                assert got is not vars(again)[name]
        else:
            assert got is value
    assert made == expected
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.__setattr__(dataclasses.fields(cls)[0].name, None)


@pytest.mark.parametrize("decorate", ["direct_init", "direct_init_read_often"])
def test_both_ways_of_filling_the_dict_handle_every_kind_of_field(decorate: str) -> None:
    """A default, a default factory, a field left out of `__init__` (made by its factory), a
    keyword-only field and `__post_init__`: the instance dict, its order and the post-init's work
    are the generated `__init__`'s, whichever way the dict is filled."""
    from rag_rerank import frozen

    made: list[Any] = []

    @getattr(frozen, decorate)
    @dataclasses.dataclass(frozen=True)
    class Value:
        a: int
        b: str = "b"
        c: list[int] = dataclasses.field(default_factory=list)
        d: dict[str, int] = dataclasses.field(default_factory=dict, init=False)
        e: float = dataclasses.field(default=0.5, kw_only=True)

        def __post_init__(self) -> None:
            made.append(dict(vars(self)))

    generated = generated_init(Value)
    for args, kwargs in (((1,), {}), ((1, "x", [2]), {"e": 1.5}), ((), {"a": 3, "c": [4]})):
        got = Value(*args, **kwargs)
        expected = object.__new__(Value)
        generated(expected, *args, **kwargs)
        assert list(vars(got).items()) == list(vars(expected).items())
        assert made[-1] == made[-2] == vars(got)  # __post_init__ saw the whole dict, both times
        again = Value(*args, **kwargs)
        assert got.d == {} and got.d is not again.d  # a fresh value of the factory each time
        if "c" not in kwargs and len(args) < 3:
            assert got.c == [] and got.c is not again.c
