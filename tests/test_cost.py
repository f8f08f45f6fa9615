"""The pre-flight plan and budgets (`rag_rerank/cost.py`, `engine.cost_plan`): the plan's call count
is the number of requests a real HTTP server then gets, a budget below the plan is refused before
any request, and a re-ask that would cross the budget is not sent."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rag_rerank import (
    BackendError,
    Budget,
    BudgetError,
    ConfigError,
    InputError,
    Prices,
    Reranker,
    RetryPolicy,
    plan,
    rerank,
)
from rag_rerank.cli import main
from rag_rerank.cost import estimate_answer_tokens, estimate_tokens
from tests.support.corpus import graded_chunks
from tests.support.fake_llm import FakeLLM, Reply, auto_ranker

QUERY = "What is the capital city of France?"
KEY = "sk-cost-0123456789abcdef"
PRICES = {"input": 0.15, "output": 0.60}


def _opts(srv: FakeLLM, **extra: Any) -> dict[str, Any]:
    return {"backend": "openai", "model": "fake-gpt", "base_url": srv.openai_url, "api_key": KEY, **extra}


def _calls(srv: FakeLLM) -> int:
    return sum(1 for r in srv.requests if r.api == "openai")


@pytest.fixture
def srv() -> Any:
    with FakeLLM(handler=auto_ranker()) as server:
        yield server


# --- the plan is what happens ---------------------------------------------------------------


@pytest.mark.parametrize(("n", "window_size", "concurrency"),
                         [(5, None, 4), (30, 10, 4), (95, 20, 2), (45, 15, 8)])
def test_the_plan_counts_the_requests_the_server_gets(srv: FakeLLM, n: int, window_size: int | None,
                                                       concurrency: int) -> None:
    chunks = graded_chunks(n)
    planned = plan(QUERY, chunks, 5, window_size=window_size, concurrency=concurrency, **_opts(srv))
    assert _calls(srv) == 0  # planning asks nothing
    result = rerank(QUERY, chunks, 5, window_size=window_size, concurrency=concurrency, **_opts(srv))
    assert planned.calls == planned.requests == _calls(srv) == result.meta.calls
    windows = 0 if window_size is None else -(-n // window_size)
    assert planned.round_trips == (1 if window_size is None else -(-windows // concurrency) + 1)
    assert planned.max_reasks == planned.calls * RetryPolicy().max_reasks
    assert planned.max_requests == planned.calls * RetryPolicy().max_attempts


def test_a_batch_plan_counts_every_request_of_the_batch(srv: FakeLLM) -> None:
    requests = [{"query": QUERY, "chunks": graded_chunks(5)},
                {"query": QUERY, "chunks": graded_chunks(40), "window_size": 10},
                {"query": "", "chunks": graded_chunks(3)}]  # the last one is invalid: no call
    with Reranker(**_opts(srv)) as reranker:
        planned = reranker.plan_many(requests)
        results = reranker.rerank_many(requests)
    assert planned.calls == _calls(srv) == 1 + 5
    assert isinstance(results[2], InputError)


def test_the_plan_of_a_batch_with_nothing_left_still_names_its_backend(srv: FakeLLM) -> None:
    """`batch --resume --dry-run` on a finished file planned no request and said `"backend": ""`."""
    with Reranker(**_opts(srv)) as reranker:
        empty = reranker.plan_many([])
        one = reranker.plan_many([{"query": QUERY, "chunks": graded_chunks(3)}])
    assert (empty.backend, empty.model) == (one.backend, one.model) == ("openai", one.model)
    assert empty.model and (empty.calls, empty.requests) == (0, 0)


def test_cost_comes_from_the_callers_prices(srv: FakeLLM) -> None:
    planned = plan(QUERY, graded_chunks(10), 3, prices=PRICES, **_opts(srv))
    expected = (planned.prompt_tokens * 0.15 + planned.completion_tokens * 0.60) / 1e6
    assert planned.cost == pytest.approx(expected)
    assert plan(QUERY, graded_chunks(10), 3, **_opts(srv)).cost is None  # no price is written in the package
    assert Prices(0.15, 0.60).cost(1_000_000, 1_000_000) == pytest.approx(0.75)


def test_the_local_backend_plans_no_request() -> None:
    planned = plan(QUERY, graded_chunks(10), 3, prices=PRICES)
    assert (planned.calls, planned.requests, planned.total_tokens, planned.cost) == (1, 0, 0, 0.0)


def test_the_cache_a_plan_knows_about(srv: FakeLLM, tmp_path: Path) -> None:
    rerank(QUERY, graded_chunks(8), 3, cache=tmp_path, **_opts(srv))
    planned = plan(QUERY, graded_chunks(8), 3, cache=tmp_path, **_opts(srv))
    assert (planned.calls, planned.requests, planned.to_dict()["cached"]) == (1, 0, 1)
    # A budget of no request at all fits a call the cache answers.
    result = rerank(QUERY, graded_chunks(8), 3, cache=tmp_path, budget={"max_calls": 0}, **_opts(srv))
    assert result.meta.cache["hits"] == 1 and _calls(srv) == 1


# --- budgets --------------------------------------------------------------------------------


def test_a_budget_below_the_plan_is_refused_before_any_request(srv: FakeLLM) -> None:
    with pytest.raises(BudgetError, match="max_calls=3: the plan makes 4 requests") as caught:
        rerank(QUERY, graded_chunks(30), 5, window_size=10, budget=Budget(max_calls=3), **_opts(srv))
    assert _calls(srv) == 0
    assert caught.value.plan["calls"] == 4 and caught.value.limits
    with pytest.raises(BudgetError, match="max_cost"):
        rerank(QUERY, graded_chunks(30), 5, prices=PRICES, budget={"max_cost": 1e-6}, **_opts(srv))
    with pytest.raises(BudgetError, match="max_tokens"):
        rerank(QUERY, graded_chunks(30), 5, budget={"max_tokens": 100}, **_opts(srv))
    assert _calls(srv) == 0
    fits = plan(QUERY, graded_chunks(30), 5, prices=PRICES, **_opts(srv))
    budget = {"max_calls": 1, "max_tokens": fits.total_tokens, "max_cost": fits.cost}
    rerank(QUERY, graded_chunks(30), 5, prices=PRICES, budget=budget, **_opts(srv))
    assert _calls(srv) == 1


def test_a_batch_over_its_budget_is_refused_before_any_request(srv: FakeLLM) -> None:
    requests = [{"query": QUERY, "chunks": graded_chunks(5)} for _ in range(3)]
    with Reranker(**_opts(srv)) as reranker, pytest.raises(BudgetError, match="the batch would exceed"):
        reranker.rerank_many(requests, budget={"max_calls": 2})
    assert _calls(srv) == 0


def test_a_reask_that_would_cross_the_budget_is_not_sent() -> None:
    bad = Reply.openai_text("I think chunk c1 is best.")
    with FakeLLM([bad] * 6) as server:
        with pytest.raises(BackendError, match="max_calls=2 is reached") as caught:
            rerank(QUERY, graded_chunks(5), 3, budget={"max_calls": 2}, **_opts(server))
        assert _calls(server) == 2  # the first attempt and one re-ask; the second re-ask was refused
        assert len(caught.value.attempts) == 2
    with FakeLLM([bad] * 6) as server:
        result = rerank(QUERY, graded_chunks(5), 3, budget={"max_calls": 1}, fallback="local",
                        **_opts(server))
        assert _calls(server) == 1 and result.meta.fallback == "local"


def test_calls_in_flight_at_once_cannot_all_pass_a_limit_with_room_for_one() -> None:
    """A batch's re-asks check the shared budget at about the same time: each request's estimate is
    held from the check until its answer is counted, so the limit holds, not the limit plus the
    calls in flight."""
    bad = Reply.openai_text("I think chunk c1 is best.", delay=0.2)
    with FakeLLM(handler=lambda req: bad) as server, Reranker(**_opts(server)) as reranker:
        requests = [{"query": QUERY, "chunks": graded_chunks(5, tag=str(i))} for i in range(4)]
        results = reranker.rerank_many(requests, concurrency=4, budget={"max_calls": 5})
        assert all(isinstance(r, BackendError) for r in results)
        assert _calls(server) == 5  # 4 first requests and one re-ask, never 4 re-asks at once


def test_a_token_budget_stops_a_reask_that_would_cross_it() -> None:
    bad = Reply.openai_text("no json")  # the test server reports 120 tokens per request
    with FakeLLM([bad] * 6) as server:
        planned = plan(QUERY, graded_chunks(5), 3, **_opts(server))
        budget = {"max_tokens": planned.total_tokens + 50}
        with pytest.raises(BackendError, match="max_tokens="):
            rerank(QUERY, graded_chunks(5), 3, budget=budget, **_opts(server))
        assert _calls(server) == 1


def test_a_batch_budget_is_shared_by_its_requests() -> None:
    bad = Reply.openai_text("no json")
    with FakeLLM([bad] * 20) as server, Reranker(**_opts(server)) as reranker:
        results = reranker.rerank_many([{"query": QUERY, "chunks": graded_chunks(5)} for _ in range(3)],
                                       concurrency=1, budget={"max_calls": 4})
        assert _calls(server) == 4  # three first attempts, then one re-ask: the budget is spent
        assert all(isinstance(r, BackendError) for r in results)


def test_bad_budgets_and_prices_name_every_field(srv: FakeLLM) -> None:
    with pytest.raises(InputError) as caught:
        rerank(QUERY, graded_chunks(3), 3, budget={"max_calls": -1, "max_cost": 2, "max_money": 1},
               prices={"input": "cheap"}, **_opts(srv))
    paths = {v.path for v in caught.value.violations}
    assert {"budget.max_money", "prices.input", "prices.output"} <= paths
    with pytest.raises(InputError) as caught:
        rerank(QUERY, graded_chunks(3), 3, budget={"max_calls": -1, "max_cost": 2}, **_opts(srv))
    paths = {v.path for v in caught.value.violations}
    assert {"budget.max_calls", "budget.max_cost"} <= paths
    assert any("needs prices" in v.message for v in caught.value.violations)
    with pytest.raises(InputError, match="budget must be"):
        rerank(QUERY, graded_chunks(3), 3, budget=5, **_opts(srv))
    assert _calls(srv) == 0


# --- the estimate ---------------------------------------------------------------------------


@given(st.text())
@example("_")  # an underscore is a symbol to BPE: it was counted as nothing
@example("__")
@example("a_b")
def test_the_token_estimate_takes_any_text(text: str) -> None:
    n = estimate_tokens(text)
    # a byte-level BPE never makes more tokens than the text has UTF-8 bytes
    assert isinstance(n, int) and 0 <= n <= len(text.encode("utf-8", "surrogatepass")) + 1
    assert (n == 0) == (text.strip() == "" and "\n" not in text and len(text) < 2)


def test_the_token_estimate_grows_with_the_text() -> None:
    words = "The quick brown fox jumps over the lazy dog. " * 20
    assert estimate_tokens(words) < estimate_tokens(words * 2) <= 2 * estimate_tokens(words) + 1
    # about 10 tokens per such sentence, as BPE tokenizers count English prose
    assert 8 * 20 <= estimate_tokens(words) <= 14 * 20
    ids = [f"c{i}" for i in range(10)]
    assert estimate_answer_tokens(10, 3, ids) > estimate_answer_tokens(10, 1, ids)


# --- the command line -----------------------------------------------------------------------


def _write(tmp_path: Path, name: str, rows: list[Any]) -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_cli_dry_run_makes_no_request(srv: FakeLLM, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    chunks = _write(tmp_path, "c.jsonl", graded_chunks(30))
    base = ["rerank", "-q", QUERY, "-c", str(chunks), "--backend", "openai", "-m", "fake-gpt",
            "--base-url", srv.openai_url, "--window-size", "10"]
    assert main([*base, "--dry-run", "--price-input", "0.15", "--price-output", "0.6"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["calls"] == 4 and planned["cost"] > 0 and _calls(srv) == 0
    assert main([*base, "--dry-run", "--budget-calls", "3"]) == 2
    cap = capsys.readouterr()
    assert json.loads(cap.out)["exceeded"] and "exceeds its budget" in cap.err
    assert main([*base, "--budget-calls", "3"]) == 2
    assert "no request was made" in capsys.readouterr().err and _calls(srv) == 0
    assert main([*base, "--budget-cost", "1"]) == 2
    assert "needs prices" in capsys.readouterr().err
    assert main([*base, "--price-input", "1"]) == 2


def test_cli_batch_dry_run_and_budget(srv: FakeLLM, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    src = _write(tmp_path, "in.jsonl", [{"query": QUERY, "chunks": graded_chunks(5)},
                                        {"query": QUERY, "chunks": graded_chunks(30), "window_size": 10}])
    base = ["batch", "-i", str(src), "--backend", "openai", "-m", "fake-gpt", "--base-url", srv.openai_url,
            "--no-progress"]
    assert main([*base, "--dry-run"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["calls"] == 5 and planned["requests_planned"] == 2 and _calls(srv) == 0
    assert main([*base, "-o", str(tmp_path / "out.jsonl"), "--budget-calls", "4"]) == 2
    assert "the batch would exceed its budget" in capsys.readouterr().err and _calls(srv) == 0
    assert main([*base, "-o", str(tmp_path / "out2.jsonl"), "--budget-calls", "5"]) == 0
    assert _calls(srv) == 5


# --- a plan needs no credentials ------------------------------------------------------------


@pytest.mark.parametrize(("backend", "env"), [("openai", "OPENAI"), ("anthropic", "ANTHROPIC")])
def test_a_plan_needs_no_api_key(backend: str, env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan(..., backend="openai")`, `rerank --dry-run` and `batch --dry-run` refused with "no API
    key" (exit 2), though a plan sends nothing; a real rerank still refuses before any request."""
    for name in (f"{env}_API_KEY", f"{env}_BASE_URL", "RAG_RERANK_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    planned = plan(QUERY, graded_chunks(30), 5, backend=backend, window_size=10, prices=PRICES)
    assert planned.calls == 4 and planned.requests == 4 and planned.cost is not None and planned.cost > 0
    chunks = _write(tmp_path, "c.jsonl", graded_chunks(12))
    assert main(["rerank", "-q", QUERY, "-c", str(chunks), "--backend", backend, "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["calls"] == 1
    src = _write(tmp_path, "in.jsonl", [{"query": QUERY, "chunks": graded_chunks(5)}] * 3)
    assert main(["batch", "-i", str(src), "--backend", backend, "--dry-run", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["calls"] == 3
    with pytest.raises(ConfigError, match="no API key"):
        rerank(QUERY, graded_chunks(5), backend=backend)
    assert main(["rerank", "-q", QUERY, "-c", str(chunks), "--backend", backend]) == 2
    assert "no API key" in capsys.readouterr().err


def test_one_estimator_counts_the_plan_and_the_output_budget() -> None:
    """The plan's completion estimate and the first attempt's max_tokens came from two formulas
    (cost.py and retry.py) that disagreed; both are tokens.py's now, the budget the estimate with
    room to spare, and a tokenizer hooked in counts for both."""
    from rag_rerank.guard import validate_request
    from rag_rerank.tokens import BUDGET_FACTOR, answer_budget, answer_tokens

    for n, k in ((5, 3), (20, 5), (50, 10), (50, 50)):
        request = validate_request(QUERY, graded_chunks(n), k, 0.7)
        expected = estimate_answer_tokens(n, k, request.ids)
        assert expected == answer_tokens(n, k, request.ids)
        budget = RetryPolicy().output_budget(request, k)
        assert budget == answer_budget(n, k, request.ids, RetryPolicy.max_tokens_cap)
        assert budget == max(512, math.ceil(BUDGET_FACTOR * expected))

    def by_characters(text: str) -> int:  # a tokenizer of one's own, hooked in
        return len(text)

    assert answer_tokens(1, 1, ["abcdef"], by_characters) == answer_tokens(1, 1, ["x"]) + 5
