"""`fallback.answers` (rag_rerank/fallback.py): who answered each ask, and the record of every call."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rag_rerank.backends.factory import make_backend
from rag_rerank.embed import get_embedder
from rag_rerank.engine import plan
from rag_rerank.errors import BackendError
from rag_rerank.fallback import Answer, answers
from rag_rerank.options import Options
from rag_rerank.retry import Outcome
from rag_rerank.steps import Calls, Setup

_SETUP = Setup(make_backend("local"), "local", get_embedder("lexical"))
_PLAN = plan(_SETUP, "q", [{"id": "a", "text": "q a"}, {"id": "b", "text": "b"}], Options())


def _answered(asks: list[tuple[Any, str, str]], outcomes: list[Any]) -> list[Answer]:
    flow = answers(_PLAN, asks, workers=1, limit=None)
    step = next(flow)
    assert isinstance(step, Calls) and len(step.calls) == len(asks)
    try:
        flow.send(outcomes)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("answers asked for more calls with no fallback chain")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(["outcome", "backend", "other"]), min_size=1, max_size=4))
def test_with_nothing_to_fall_back_on_each_answer_is_made_once_as_the_general_path_made_it(
        kinds: list[str]) -> None:
    """With no fallback chain (nearly every call) the answers are made at once with their records
    (issue 37), as the general path made them: the session backend's outcome, or its error, each
    with the one record of its call, in the order asked."""
    asks = [(_PLAN.ask, _PLAN.prompt, f"call {i}") for i in range(len(kinds))]
    made = {"outcome": lambda: Outcome({"ranked": [], "dropped": []}, (), ("r",), {"prompt_tokens": 3}, "m"),
            "backend": lambda: BackendError("local: no valid answer"), "other": lambda: ValueError("bug")}
    outcomes = [made[k]() for k in kinds]
    got = _answered(asks, outcomes)
    assert len(got) == len(kinds)
    for answer, outcome, (ask, _, label) in zip(got, outcomes, asks, strict=True):
        ok = isinstance(outcome, Outcome)
        assert type(answer) is Answer and answer.used is None and answer.step is None
        assert (answer.outcome, answer.error) == ((outcome, None) if ok else (None, outcome))
        (record,) = answer.records
        assert (record.stage, record.index, record.scorer, record.role, record.ok) == \
            ("call", 1, "local", "primary", ok)
        assert (record.label, record.size) == (label, len(ask.chunks))
        assert record.usage == (dict(outcome.usage) if ok else {})
        assert record.error_type == (None if ok else type(outcome).__name__)
