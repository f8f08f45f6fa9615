"""call_with_retries / acall_with_retries: every failure class, with the real SDKs over HTTP.

Waits are observed through the policy's injectable `sleep` (so the suite stays fast); one test
really sleeps a 1-second Retry-After and measures it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from rag_rerank.backends.anthropic import AnthropicBackend
from rag_rerank.backends.base import Completion
from rag_rerank.backends.openai import OpenAIBackend, forget_modes
from rag_rerank.errors import BackendError, InputError, InternalError
from rag_rerank.guard import validate_request
from rag_rerank.guard.repair import repair_output
from rag_rerank.render import render
from rag_rerank.retry import Outcome, RetryPolicy, acall_with_retries, call_with_retries
from rag_rerank.skill import load_skill
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply

KEY = "sk-retry-SECRET-424242424242"
GOOD = {"ranked": [{"id": "c3", "score": 0.92, "reason": "IVF is preferred when index memory is constrained"},
                   {"id": "c2", "score": 0.6, "reason": "IVF partitions vectors into Voronoi cells"}],
        "dropped": [{"id": "c1", "reason": "HNSW only"}, {"id": "c4", "reason": "FAISS hosts both"},
                    {"id": "c5", "reason": "risotto cooking"}]}
MINTED = {"ranked": [{"id": "C3", "score": 0.92, "reason": "IVF is preferred when memory is constrained"}]}


class Sleeps:
    """Records requested waits instead of sleeping (sync and async). tenacity also "sleeps" 0 s
    before a re-ask; only real waits are recorded."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        if seconds:
            self.waits.append(seconds)

    async def asleep(self, seconds: float) -> None:
        self(seconds)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    forget_modes()


@pytest.fixture()
def request_():
    ex = load_skill().example("happy-path")
    return validate_request(ex.query, ex.chunks, ex.top_k, ex.lambda_)


@pytest.fixture()
def sleeps() -> Sleeps:
    return Sleeps()


def policy(sleeps: Sleeps, **kw) -> RetryPolicy:
    base = {"sleep": sleeps, "asleep": sleeps.asleep, "initial_wait_s": 0.5, "jitter_s": 0.25,
            "max_wait_s": 4.0, "deadline_s": 60.0,
            "uniform": lambda a, b: b}  # jitter pinned at its upper bound, so waits are exact
    base.update(kw)
    return RetryPolicy(**base)


def run(srv: FakeLLM, request_, pol: RetryPolicy, *, repair: bool = True, timeout: float = 10.0) -> Outcome:
    backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, timeout=timeout)
    return call_with_retries(backend, request_, render(request_), guard_top_k=request_.top_k, policy=pol,
                             repair=repair)


def kinds(attempts) -> list[str]:
    return [a.kind for a in attempts]


def test_valid_output_first_try(request_, sleeps) -> None:
    with FakeLLM([Reply.openai_text(json.dumps(GOOD))]) as srv:
        out = run(srv, request_, policy(sleeps))
    assert out.obj == GOOD and kinds(out.attempts) == ["ok"]
    assert out.repairs == () and sleeps.waits == []
    assert out.usage["total_tokens"] == 120 and out.model == "fake-gpt"


def test_fenced_output_is_repaired_and_recorded(request_, sleeps) -> None:
    fenced = "Here you go:\n```json\n" + json.dumps(GOOD) + "\n```"
    with FakeLLM([Reply.openai_text(fenced)]) as srv:
        out = run(srv, request_, policy(sleeps))
    assert out.obj == GOOD and kinds(out.attempts) == ["ok"]
    assert out.repairs and any("fence" in r for r in out.repairs)
    assert "repaired" in out.attempts[0].detail


def test_fenced_output_without_repair_is_reasked(request_, sleeps) -> None:
    fenced = "```json\n" + json.dumps(GOOD) + "\n```"
    with FakeLLM([Reply.openai_text(fenced), Reply.openai_text(json.dumps(GOOD))]) as srv:
        out = run(srv, request_, policy(sleeps), repair=False)
    assert kinds(out.attempts) == ["invalid_output", "ok"] and out.repairs == ()
    assert "code fence" in srv.requests[1].last_user_text


def test_minted_id_then_correct_reask(request_, sleeps) -> None:
    with FakeLLM([Reply.openai_text(json.dumps(MINTED)), Reply.openai_text(json.dumps(GOOD))]) as srv:
        out = run(srv, request_, policy(sleeps))
    assert out.obj == GOOD and kinds(out.attempts) == ["invalid_output", "ok"]
    bad = out.attempts[0]
    assert any(v.id == "C3" and "not an input id" in v.message for v in bad.violations)
    assert sleeps.waits == []  # a re-ask does not back off
    reask = srv.requests[1].body["messages"]
    assert [m["role"] for m in reask] == ["system", "user", "assistant", "user"]
    assert reask[2]["content"] == json.dumps(MINTED)
    assert "'C3' is not an input id" in reask[3]["content"]
    assert out.usage["total_tokens"] == 240  # both calls counted


def test_invalid_output_stops_after_two_reasks(request_, sleeps) -> None:
    with FakeLLM([Reply.openai_text(json.dumps(MINTED))] * 3) as srv, pytest.raises(BackendError) as info:
        run(srv, request_, policy(sleeps))
    err = info.value
    assert kinds(err.attempts) == ["invalid_output"] * 3 and len(srv.requests) == 3
    assert all(a.violations for a in err.attempts)
    assert "after 2 re-ask" in str(err)


def test_429_with_retry_after_waits_exactly_that(request_, sleeps) -> None:
    script = [Reply.openai_error(429, "rate limited", headers={"Retry-After": "3"}),
              Reply.openai_error(429, "rate limited", headers={"retry-after-ms": "1250"}),
              Reply.openai_text(json.dumps(GOOD))]
    with FakeLLM(script) as srv:
        out = run(srv, request_, policy(sleeps))
    assert kinds(out.attempts) == ["transient", "transient", "ok"]
    assert sleeps.waits == [3.0, 1.25]
    assert [a.wait_s for a in out.attempts] == [3.0, 1.25, 0.0]
    assert len(srv.requests) == 3


def test_retry_after_is_really_waited(request_) -> None:
    script = [Reply.openai_error(429, "rate limited", headers={"Retry-After": "1"}),
              Reply.openai_text(json.dumps(GOOD))]
    with FakeLLM(script) as srv:
        out = run(srv, request_, RetryPolicy())
    gap = srv.requests[1].received_at - srv.requests[0].received_at
    assert kinds(out.attempts) == ["transient", "ok"]
    assert 1.0 <= gap < 3.0, gap


def test_500_then_success_backs_off_exponentially(request_, sleeps) -> None:
    script = [Reply.openai_error(500, "boom", type_="server_error"),
              Reply.openai_error(502, "bad gateway", type_="server_error"),
              Reply.openai_text(json.dumps(GOOD))]
    with FakeLLM(script) as srv:
        out = run(srv, request_, policy(sleeps))
    assert kinds(out.attempts) == ["transient", "transient", "ok"]
    assert sleeps.waits == [0.5 + 0.25, 1.0 + 0.25]  # initial * 2**(n-1) + jitter (pinned at its bound)


def test_jitter_stays_within_bounds(sleeps) -> None:
    pol = RetryPolicy(initial_wait_s=1.0, multiplier=2.0, max_wait_s=5.0, jitter_s=0.5)
    for n, base in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)):
        waits = [pol.backoff(n) for _ in range(200)]
        assert all(base <= w <= base + 0.5 for w in waits)
        assert max(waits) - min(waits) > 0.05  # it really is jittered


def test_timeout_then_success(request_, sleeps) -> None:
    script = [Reply.openai_text(json.dumps(GOOD), delay=1.5), Reply.openai_text(json.dumps(GOOD))]
    with FakeLLM(script) as srv:
        out = run(srv, request_, policy(sleeps), timeout=0.3)
    assert kinds(out.attempts) == ["transient", "ok"]
    assert "timed out" in out.attempts[0].detail and sleeps.waits == [0.75]


def test_truncation_retries_once_with_a_larger_budget_not_a_reask(request_, sleeps) -> None:
    cut = json.dumps(GOOD)[:40]
    script = [Reply.openai_text(cut, finish_reason="length"), Reply.openai_text(json.dumps(GOOD))]
    with FakeLLM(script) as srv:
        out = run(srv, request_, policy(sleeps, max_tokens=300))
    assert kinds(out.attempts) == ["truncated", "ok"]
    assert [r.body["max_tokens"] for r in srv.requests] == [300, 600]
    assert [m["role"] for m in srv.requests[1].body["messages"]] == ["system", "user"]  # no feedback turn


def test_truncated_twice_gives_up(request_, sleeps) -> None:
    cut = json.dumps(GOOD)[:40]
    with FakeLLM([Reply.openai_text(cut, finish_reason="length")] * 2) as srv, \
            pytest.raises(BackendError, match="still truncated") as info:
        run(srv, request_, policy(sleeps, max_tokens=300))
    assert kinds(info.value.attempts) == ["truncated", "truncated"] and len(srv.requests) == 2


def test_401_fails_fast_and_never_leaks_the_key(request_, sleeps, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with FakeLLM([Reply.openai_error(401, f"Incorrect API key provided: {KEY}")]) as srv, \
            pytest.raises(BackendError) as info:
        run(srv, request_, policy(sleeps))
    err = info.value
    assert kinds(err.attempts) == ["fatal"] and len(srv.requests) == 1 and sleeps.waits == []
    assert "401" in str(err)
    everything = str(err) + repr(err.attempts) + caplog.text
    assert KEY not in everything


def test_the_key_stays_out_of_outcome_and_logs(request_, sleeps, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    script = [Reply.openai_error(503, f"upstream rejected {KEY}"), Reply.openai_text(json.dumps(GOOD))]
    with FakeLLM(script) as srv:
        out = run(srv, request_, policy(sleeps))
    assert KEY not in repr(out) + caplog.text
    assert srv.requests[0].headers["authorization"] == f"Bearer {KEY}"  # it was really used


def test_refusal_fails_fast(request_, sleeps) -> None:
    with FakeLLM([Reply.openai_text(None, refusal="I won't rank these.")]) as srv, \
            pytest.raises(BackendError, match="refused") as info:
        run(srv, request_, policy(sleeps))
    assert kinds(info.value.attempts) == ["fatal"] and len(srv.requests) == 1


def test_attempts_are_bounded(request_, sleeps) -> None:
    with FakeLLM([Reply.openai_error(503, "busy")] * 10) as srv, \
            pytest.raises(BackendError, match="max_attempts=4") as info:
        run(srv, request_, policy(sleeps, max_attempts=4))
    assert kinds(info.value.attempts) == ["transient"] * 4 and len(srv.requests) == 4
    assert sleeps.waits == [0.75, 1.25, 2.25]


def test_deadline_stops_before_a_wait_that_would_cross_it(request_, sleeps) -> None:
    script = [Reply.openai_error(429, "slow", headers={"Retry-After": "30"})] * 3
    with FakeLLM(script) as srv, pytest.raises(BackendError, match="deadline of 10s") as info:
        run(srv, request_, policy(sleeps, deadline_s=10.0))
    assert len(srv.requests) == 1 and sleeps.waits == []
    assert info.value.attempts[0].wait_s == 0.0  # the wait was not taken


def test_anthropic_overloaded_then_minted_then_valid(request_, sleeps) -> None:
    script = [Reply.anthropic_error(529, "Overloaded", type_="overloaded_error"),
              Reply.anthropic_tool(MINTED), Reply.anthropic_tool(GOOD)]
    with FakeLLM(script) as srv:
        backend = AnthropicBackend(base_url=srv.anthropic_url, api_key=KEY)
        out = call_with_retries(backend, request_, render(request_), guard_top_k=3, policy=policy(sleeps))
    assert out.obj == GOOD and kinds(out.attempts) == ["transient", "invalid_output", "ok"]
    assert sleeps.waits == [0.75]
    assert srv.requests[2].body["messages"][2]["content"][0]["is_error"] is True


def test_async_variant(request_, sleeps) -> None:
    script = [Reply.openai_error(500, "boom"), Reply.openai_text(json.dumps(MINTED)),
              Reply.openai_text(json.dumps(GOOD))]
    with FakeLLM(script) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY)
        out = asyncio.run(acall_with_retries(backend, request_, render(request_), guard_top_k=3,
                                             policy=policy(sleeps)))
    assert out.obj == GOOD and kinds(out.attempts) == ["transient", "invalid_output", "ok"]
    assert sleeps.waits == [0.75]


def test_async_deadline_cuts_a_hanging_call(request_, sleeps) -> None:
    with FakeLLM([Reply.openai_text(json.dumps(GOOD), delay=3.0)]) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, timeout=30)
        start = time.monotonic()
        with pytest.raises(BackendError, match="deadline") as info:
            asyncio.run(acall_with_retries(backend, request_, render(request_), guard_top_k=3,
                                           policy=policy(sleeps, deadline_s=0.5)))
        took = time.monotonic() - start
    assert took < 2.5 and kinds(info.value.attempts) == ["transient"]


def test_concurrent_async_calls_keep_their_own_state(request_, sleeps) -> None:
    def answer(req: RecordedRequest) -> Reply:  # minted the first time a prompt is seen, valid on the re-ask
        return Reply.openai_text(json.dumps(GOOD if len(req.body["messages"]) > 2 else MINTED))

    with FakeLLM(handler=answer) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY)

        async def many():
            calls = [acall_with_retries(backend, request_, render(request_), guard_top_k=3,
                                        policy=policy(sleeps)) for _ in range(6)]
            return await asyncio.gather(*calls)

        outs = asyncio.run(many())
    assert all(kinds(o.attempts) == ["invalid_output", "ok"] for o in outs)
    assert len(srv.requests) == 12


def test_policy_rejects_nonsense_with_our_error() -> None:
    with pytest.raises(InputError) as info:
        RetryPolicy(max_attempts=0, deadline_s=-1, multiplier=0.5)
    paths = {v.path for v in info.value.violations}
    assert paths == {"policy.max_attempts", "policy.deadline_s", "policy.multiplier"}


def test_output_budget_grows_with_the_request(request_) -> None:
    pol = RetryPolicy()
    small = pol.output_budget(request_, 3)
    big_chunks = [{"id": f"chunk-{i:03d}", "text": f"text {i}"} for i in range(50)]
    big = pol.output_budget(validate_request("q", big_chunks, 10, 0.7), 10)
    assert 512 <= small < big <= pol.max_tokens_cap
    assert RetryPolicy(max_tokens=100).output_budget(request_, 3) == 100


# --- issue 15: the deadline bounds a blocking call too ----------------------------------------------


def test_sync_call_is_given_what_is_left_of_the_deadline_as_its_timeout(request_, sleeps) -> None:
    """A server that never answers: the client (timeout 20 s) is told to give up at the deadline."""
    with FakeLLM([Reply.openai_text(json.dumps(GOOD), delay=30.0)]) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, timeout=20.0)
        start = time.monotonic()
        with pytest.raises(BackendError) as info:
            call_with_retries(backend, request_, render(request_), guard_top_k=3,
                              policy=policy(sleeps, deadline_s=1.0))
        took = time.monotonic() - start
    assert "the deadline of 1s was crossed" in str(info.value)
    assert kinds(info.value.attempts) == ["transient"] and len(srv.requests) == 1
    assert "timed out (cut when the deadline of 1s was crossed)" in info.value.attempts[0].detail
    assert took < 15.0  # loose: the bug took the client's 20 s


def test_the_deadline_is_passed_to_a_backend_that_takes_a_timeout(request_, sleeps) -> None:
    """The bound itself, without timing: every call gets timeout <= deadline, shrinking as time passes."""
    seen: list[float] = []

    class Recorder:
        name, model = "recorder", None

        def complete(self, prompt, request, *, max_tokens, feedback=(), previous=None, timeout=None):
            seen.append(timeout)
            from rag_rerank.errors import TransientFailure

            raise TransientFailure("recorder: busy")

    now = [0.0]

    def clock() -> float:  # every reading of the clock is half a second later
        now[0] += 0.5
        return now[0]

    pol = policy(sleeps, deadline_s=5.0, initial_wait_s=0.0, jitter_s=0.0, clock=clock)
    with pytest.raises(BackendError, match=r"(was|would be) crossed"):
        call_with_retries(Recorder(), request_, render(request_), guard_top_k=3, policy=pol)
    assert len(seen) >= 2 and all(0 < t < 5.0 for t in seen) and seen == sorted(seen, reverse=True)


def test_truncation_error_names_every_max_tokens_used(request_, sleeps) -> None:
    cut = Reply.openai_text('{"ranked": [', finish_reason="length")
    with FakeLLM([cut, cut]) as srv, pytest.raises(BackendError) as info:
        run(srv, request_, policy(sleeps, max_tokens=512))
    assert [r.body["max_tokens"] for r in srv.requests] == [512, 1024]
    assert "still truncated at max_tokens=512, 1024" in str(info.value)
    assert "2048" not in str(info.value).split(" [#")[0]


def test_a_reason_quoting_the_query_is_accepted_on_the_first_try(request_, sleeps) -> None:
    """The card's query is quoted in a reason: the guard gets the request's query, so this valid
    answer is not re-asked as an "invented quotation" (it would be without the query)."""
    quoting = {**GOOD, "ranked": [{**GOOD["ranked"][0],
                                   "reason": f'answers "{request_.query.rstrip("?")}": IVF is preferred when '
                                             "index memory is constrained"}, GOOD["ranked"][1]]}
    with FakeLLM([Reply.openai_text(json.dumps(quoting))]) as srv:
        out = run(srv, request_, policy(sleeps))
    assert out.obj == quoting and kinds(out.attempts) == ["ok"]


class _ScoredButWrong:
    """A backend declaring itself scored (guard-valid by construction) that writes a minted id:
    what a bug in a scored backend would look like to the retry loop."""

    name = "scored-test"
    model = None
    scored = True

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, prompt: str, request: object, **_: object) -> Completion:
        self.calls += 1
        return Completion(text=json.dumps(MINTED))

    async def acomplete(self, prompt: str, request: object, **kw: object) -> Completion:
        return self.complete(prompt, request, **kw)


def test_a_scored_backend_is_never_re_asked_and_its_refusal_is_an_internal_error(request_) -> None:
    # Re-asking a deterministic scorer could only repeat its answer (two wasted calls, then a
    # BackendError the user cannot act on): one call, then the bug named as one.
    backend = _ScoredButWrong()
    with pytest.raises(InternalError, match="scored-test wrote an answer its own output guard") as err:
        call_with_retries(backend, request_, render(request_), guard_top_k=3)
    assert backend.calls == 1 and not isinstance(err.value, BackendError)
    assert any("'C3' is not an input id" in v.message for v in err.value.violations)
    with pytest.raises(InternalError):
        asyncio.run(acall_with_retries(backend, request_, render(request_), guard_top_k=3))
    assert backend.calls == 2


@pytest.mark.parametrize("around", [("", ""), ("  \n", "\n\t"), ("", " trailing }"), ("<think>x</think>", ""),
                                    ("Sure:\n", "\nDone.")])
def test_an_answer_is_judged_as_its_repair_gives_it(request_, sleeps, around: tuple[str, str]) -> None:
    """A bare object is judged without the repair's second decode (retry.judge's fast path): the
    accepted text and repairs are what `repair_output` gives, with or without text around it."""
    raw = around[0] + json.dumps(GOOD) + around[1]
    with FakeLLM([Reply.openai_text(raw)]) as srv:
        out = run(srv, request_, policy(sleeps))
    expected = repair_output(raw)
    assert out.obj == GOOD and kinds(out.attempts) == ["ok"]
    assert (out.text, out.repairs) == (expected.text, expected.repairs)
    assert bool(out.repairs) == (around[0].strip() != "" or around[1].strip() != "")


@pytest.mark.parametrize("cached", [False, True])
def test_with_latency_is_replace_of_the_latency_alone(cached: bool) -> None:
    """`Outcome.with_latency` builds the outcome field by field: every field but `latency_ms` is
    the same object as `dataclasses.replace` gives, and a field added to `Outcome` later fails
    here until `with_latency` passes it on."""
    import dataclasses

    from rag_rerank.errors import Attempt

    outcome = Outcome({"ranked": [], "dropped": []}, (Attempt(1, "ok", "accepted"),), ("stripped a fence",),
                      {"prompt_tokens": 3}, "m", notes=("a note",), text="{}", cached=cached, latency_ms=1.5,
                      decided={"x": (1, 2)})
    made = outcome.with_latency(42.25)
    expected = dataclasses.replace(outcome, latency_ms=42.25)
    assert made == expected
    for f in dataclasses.fields(Outcome):
        assert getattr(made, f.name) is getattr(expected, f.name) or f.name == "latency_ms"
    assert made.latency_ms == 42.25 and outcome.latency_ms == 1.5


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("reasks", [0, 1])  # accepted at once; or after a re-ask, in tenacity's loop
def test_latency_counts_from_the_drivers_start(request_, sleeps, asynchronous: bool, reasks: int) -> None:
    """`started=` (the driver's `time.perf_counter()` when the call began, `session._call`) is
    what the outcome's latency counts from, set as the outcome is made (not by a second copy);
    without it the latency is 0.0, as before a driver times the call."""
    replies = [Reply.openai_text("not json")] * reasks + [Reply.openai_text(json.dumps(GOOD))]
    with FakeLLM(replies * 2) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY)

        def call(started: float | None) -> Outcome:
            kw = {"guard_top_k": request_.top_k, "policy": policy(sleeps), "started": started}
            if asynchronous:
                return asyncio.run(acall_with_retries(backend, request_, render(request_), **kw))
            return call_with_retries(backend, request_, render(request_), **kw)

        before = time.perf_counter() - 0.5  # the driver began half a second ago
        timed = call(before)
        after = time.perf_counter()
        untimed = call(None)
    assert 500.0 <= timed.latency_ms <= (after - before) * 1000.0
    assert untimed.latency_ms == 0.0 and len(timed.attempts) == reasks + 1
    assert timed.obj == untimed.obj == GOOD


class _Scripted:
    """A backend (the `Backend` protocol, no HTTP) that hands back its completions in order."""

    name = "scripted"

    def __init__(self, *completions: Completion) -> None:
        self.completions = list(completions)

    def complete(self, prompt: str, request, **_: object) -> Completion:
        return self.completions.pop(0)


@pytest.mark.parametrize(("first", "second", "expected"), [
    ((), (), ()),
    (("a", "b"), (), ("a", "b")),
    (("a", "b"), ("b", "c", "a"), ("a", "b", "c")),
    ((), ("c", "c"), ("c",)),
])
def test_the_completions_notes_reach_the_outcome_once_each(request_, sleeps, first, second, expected) -> None:
    """Each note a completion carries (a negotiation's downgrade) is in the outcome once, in the
    order first met, across a re-ask; a call whose completions carry none has none."""
    backend = _Scripted(Completion("not json", notes=first), Completion(json.dumps(GOOD), notes=second))
    out = call_with_retries(backend, request_, render(request_), guard_top_k=request_.top_k,
                            policy=policy(sleeps))
    assert out.notes == expected and kinds(out.attempts) == ["invalid_output", "ok"]
