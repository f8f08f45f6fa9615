"""Long chunks in a request: the budget met by showing evidence (the longest chunks shrink first),
refused only with `strict` or when even the minimum cannot fit; the guard judges quotes against
what the model was shown; every surface takes `max_tokens_per_chunk`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank import InputError, plan, rerank
from rag_rerank.cli import main
from rag_rerank.cost import estimate_tokens
from rag_rerank.evidence import ELISION, MIN_TOKENS_PER_CHUNK, passages_of, select
from rag_rerank.models import Chunk, RerankRequest
from rag_rerank.shortening import (
    LITERAL_MARK,
    fit,
    marks_shown,
    most_tokens,
    original_span,
    piece_spans,
    prompt_tokens,
    shorten,
    token_counter,
    tokens_over,
)
from rag_rerank.tools import call_tool
from tests.support.fake_llm import FakeLLM, Reply

TOPICS = ["The harbour froze in the winter of {i}, and ships waited at anchor for weeks.",
          "Bakers in the old town rose at four to fire the ovens, street {i}.",
          "A surveyor measured the river's width at bridge {i} with a chain.",
          "The choir rehearsed the new hymn on Thursday {i} in the cold nave."]


def _long_chunk(i: int, answer: str | None = None, tokens: int = 2000) -> dict[str, str]:
    """A chunk of about `tokens` tokens of unrelated prose, with `answer` in its middle."""
    sentences = [TOPICS[(i + k) % 4].format(i=1000 * i + k) for k in range(tokens // 14)]
    if answer:
        sentences.insert(len(sentences) // 2, answer)
    return {"id": f"doc-{i}", "text": " ".join(sentences)}


QUERY = "how much did the vaccine trial reduce infections"
ANSWER = "The vaccine trial reduced infections by 40 percent among the enrolled nurses."


def test_the_longest_chunks_shrink_first() -> None:
    assert fit([10, 50, 300], 400, None, shrink=True) == [10, 50, 300]  # fits: untouched
    assert fit([10, 50, 300], 200, None, shrink=True) == [10, 50, 140]  # only the longest is cut
    assert fit([10, 300, 300], 200, None, shrink=True) == [10, 95, 95]
    assert fit([10, 50, 300], 400, 100, shrink=True) == [10, 50, 100]  # the explicit cap
    assert fit([10, 50, 300], 200, None, shrink=False) is None  # strict
    assert fit([100] * 10, 10 * MIN_TOKENS_PER_CHUNK - 1, None, shrink=True) is None


def test_fifty_chunks_of_2000_tokens_rerank_in_one_call_within_the_default_budget() -> None:
    chunks = [_long_chunk(i, ANSWER if i == 17 else None) for i in range(50)]
    assert sum(estimate_tokens(c["text"]) for c in chunks) > 90_000
    cost = plan(QUERY, chunks, top_k=5)
    assert cost.calls == 1 and cost.prompt_tokens <= 32_000
    result = rerank(QUERY, chunks, top_k=5)
    ids = [r.id for r in result.ranked] + [d.id for d in result.dropped]
    assert sorted(ids) == sorted(c["id"] for c in chunks) and len(ids) == len(set(ids))
    assert result.ranked[0].id == "doc-17"
    evidence = result.meta.evidence
    assert evidence is not None and set(evidence) == {c["id"] for c in chunks}
    doc = chunks[17]["text"]
    entry = evidence["doc-17"]
    assert entry["tokens_before"] > entry["tokens_after"] and entry["tokens_after"] <= entry["budget"]
    assert any(doc[a:b].find(ANSWER) >= 0 for a, b in entry["passages"])
    assert "evidence" in result.meta.to_dict()


def test_without_long_chunks_nothing_changes() -> None:
    chunks = [{"id": f"c{i}", "text": TOPICS[i % 4].format(i=i)} for i in range(6)]
    result = rerank(QUERY, chunks, top_k=3)
    assert result.meta.evidence is None and "evidence" not in result.meta.to_dict()


def test_strict_refuses_an_over_budget_request_as_before() -> None:
    chunks = [_long_chunk(i) for i in range(50)]
    with pytest.raises(InputError, match=r"max_context_tokens"):
        rerank(QUERY, chunks, strict=True)


def test_refused_only_when_even_the_minimum_budget_cannot_fit() -> None:
    chunks = [_long_chunk(i, tokens=300) for i in range(10)]
    with pytest.raises(InputError) as info:
        rerank(QUERY, chunks, limits={"max_context_tokens": 100})
    (v,) = info.value.violations
    assert f"even at {MIN_TOKENS_PER_CHUNK} tokens per chunk" in v.message
    assert "max_context_tokens" in v.message


def test_max_tokens_per_chunk_caps_each_chunk_and_is_checked() -> None:
    chunks = [_long_chunk(0, ANSWER, tokens=600), {"id": "short", "text": "A short note on vaccines."}]
    result = rerank(QUERY, chunks, top_k=2, max_tokens_per_chunk=64)
    assert set(result.meta.evidence or {}) == {"doc-0"}
    assert result.meta.evidence["doc-0"]["tokens_after"] <= 64
    for bad in (0, 15, 1.5, "64", True):
        with pytest.raises(InputError, match="max_tokens_per_chunk"):
            rerank(QUERY, chunks, max_tokens_per_chunk=bad)


def test_a_tokenizer_hook_counts_the_budget() -> None:
    class Words:
        """A caller's tokenizer: one token per word."""

        def encode(self, text: str) -> list[str]:
            return text.split()

    chunks = [_long_chunk(0, ANSWER, tokens=600)]
    by_words = rerank(QUERY, chunks, max_tokens_per_chunk=40, tokenizer=Words())
    entry = (by_words.meta.evidence or {})["doc-0"]
    assert entry["tokens_before"] == len(chunks[0]["text"].split())
    by_callable = rerank(QUERY, chunks, max_tokens_per_chunk=40, tokenizer=lambda t: len(t.split()))
    assert (by_callable.meta.evidence or {})["doc-0"] == entry
    assert token_counter(None) is estimate_tokens
    with pytest.raises(InputError, match="tokenizer"):
        rerank(QUERY, chunks, tokenizer=42)


def _answer(quote: str) -> str:
    return json.dumps({"ranked": [{"id": "doc-0", "score": 0.9, "reason": f'quotes "{quote}"'}],
                       "dropped": [{"id": "short", "reason": "off_topic"}]})


def test_the_guard_judges_a_quote_against_the_text_the_model_was_shown() -> None:
    doc = _long_chunk(0, ANSWER, tokens=600)
    doc["text"] = "The oldest map in the museum was drawn by a monk named Anselm. " + doc["text"]
    chunks = [doc, {"id": "short", "text": "The bakery opened at dawn."}]
    cut = "drawn by a monk named Anselm"  # in the chunk, but not in what the model is shown
    kept = "reduced infections by 40 percent"
    options = {"backend": "openai", "model": "m", "api_key": "x", "max_tokens_per_chunk": 64, "top_k": 1}
    with FakeLLM([Reply.openai_text(_answer(kept))]) as srv:
        result = rerank(QUERY, chunks, base_url=srv.openai_url, **options)
    (req,) = srv.requests
    assert ELISION.strip() in req.prompt or ANSWER in req.prompt
    assert cut not in req.prompt and ANSWER in req.prompt
    assert result.ranked[0].id == "doc-0" and result.meta.attempts == 1
    with FakeLLM([Reply.openai_text(_answer(cut)), Reply.openai_text(_answer(kept))]) as srv:
        result = rerank(QUERY, chunks, base_url=srv.openai_url, **options)
    assert len(srv.requests) == 2 and result.meta.attempts == 2  # refused, re-asked with the guard's error
    assert cut in srv.requests[1].prompt or "quotes" in json.dumps(srv.requests[1].body)


def _two_passages() -> tuple[list[dict[str, str]], str, str]:
    """A long chunk whose evidence at 32 tokens is two passages far apart, and a short chunk."""
    sentences = [TOPICS[k % 4].format(i=k) for k in range(60)]
    first, second = "The vaccine trial enrolled nurses.", "Infections fell by 40 percent in the vaccine arm."
    sentences[12], sentences[47] = first, second
    short = {"id": "short", "text": "The bakery opened at dawn."}
    return [{"id": "doc-0", "text": " ".join(sentences)}, short], first, second


def test_a_quote_across_the_elision_mark_is_refused_and_re_asked() -> None:
    """The model is shown the kept passages joined by the mark: a quotation inside one passage is
    accepted; one that runs across the mark (copying it, or joining the words on either side as
    one phrase) is not a phrase of the original: refused, and the model is re-asked."""
    chunks, first, second = _two_passages()
    options = {"backend": "openai", "model": "m", "api_key": "x", "max_tokens_per_chunk": 32, "top_k": 1}
    across = [f"nurses.{ELISION}Infections fell", "trial enrolled nurses infections fell by 40 percent"]
    for quote in ["Infections fell by 40 percent", *across]:
        replies = [Reply.openai_text(_answer(quote)), Reply.openai_text(_answer("enrolled nurses"))]
        with FakeLLM(replies) as srv:
            result = rerank(QUERY, chunks, base_url=srv.openai_url, **options)
        shown = srv.requests[0].prompt
        assert f"{first}{ELISION}{second}" in shown  # what the model was shown: two passages and the mark
        assert result.ranked[0].id == "doc-0"
        if quote in across:
            assert len(srv.requests) == 2 and result.meta.attempts == 2, quote
            feedback = srv.requests[1].last_user_text
            assert "one passage" in feedback and quote[:20] in feedback
        else:
            assert len(srv.requests) == 1 and result.meta.attempts == 1
        assert (result.meta.evidence or {})["doc-0"]["decided"] is None  # an LLM reads no passage's score


def test_a_quote_of_the_callers_own_elision_mark_inside_one_passage_is_accepted() -> None:
    """A caller's text that itself holds the mark (an elided citation) is shown with `LITERAL_MARK`
    in its place, so the mark in what the model reads is only ever a cut: a quotation of the caller's
    elided sentence, as shown, lies inside one kept passage and is accepted in one call, in a chunk
    that was shortened and in one that was not; a quotation across a real cut is still refused."""
    chunks, first, _ = _two_passages()
    second = "Infections fell by 40 percent […] in the vaccine arm of the trial."
    chunks[0]["text"] = chunks[0]["text"].replace(
        "Infections fell by 40 percent in the vaccine arm.", second)
    chunks[1]["text"] = "The bakery […] opened at dawn."
    shown = second.replace(ELISION.strip(), LITERAL_MARK)
    options = {"backend": "openai", "model": "m", "api_key": "x", "max_tokens_per_chunk": 40, "top_k": 2}
    for cid, quote in [("doc-0", "40 percent [⋯] in the vaccine arm"), ("short", "bakery [⋯] opened")]:
        others = [{"id": c["id"], "reason": "off_topic"} for c in chunks if c["id"] != cid]
        answer = json.dumps({"ranked": [{"id": cid, "score": 0.9, "reason": f'quotes "{quote}"'}],
                             "dropped": others})
        with FakeLLM([Reply.openai_text(answer), Reply.openai_text(answer)]) as srv:
            result = rerank(QUERY, chunks, base_url=srv.openai_url, **options)
        assert f"{first}{ELISION}{shown}" in srv.requests[0].prompt  # one cut, the caller's mark as shown
        assert len(srv.requests) == 1 and result.meta.attempts == 1, quote
        kept = (result.meta.evidence or {})["doc-0"]["passages"]
        ((start, end),) = [p for p in kept if p[1] - p[0] == len(second)]
        assert chunks[0]["text"][start:end] == second  # offsets still index the caller's own text
    quote = f"nurses.{ELISION}Infections"
    across = json.dumps({"ranked": [{"id": "doc-0", "score": 0.9, "reason": f'quotes "{quote}"'}],
                         "dropped": [{"id": "short", "reason": "off_topic"}]})
    with FakeLLM([Reply.openai_text(across), Reply.openai_text(across)]) as srv:
        rerank(QUERY, chunks, base_url=srv.openai_url, **{**options, "top_k": 1, "fallback": "local"})
    assert len(srv.requests) >= 2  # the real cut is still a cut


@given(st.lists(st.sampled_from(["[…]", " […] ", "a", " ", "…", "[", "]", "é"]), max_size=12))
def test_marks_shown_keeps_every_offset(parts: list[str]) -> None:
    text = "".join(parts)
    request = RerankRequest("q", (Chunk("a", text), Chunk("b", "plain")), 1, 0.7)
    shown = marks_shown(request)
    assert len(shown.chunks[0].text) == len(text) and ELISION.strip() not in shown.chunks[0].text
    assert shown.chunks[0].text == text.replace(ELISION.strip(), LITERAL_MARK)
    assert (shown is request) == (ELISION.strip() not in text)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.sampled_from(["[…]", "[", "…", "]", "…]", "[…", "\x00", "a", "é"]), max_size=5),
                min_size=1, max_size=5))
@example([["["], ["…]"]])  # a mark split across two texts is no mark
@example([["[…", "\x00"], ["]"]])
def test_marks_shown_finds_a_mark_only_inside_one_text(texts: list[list[str]]) -> None:
    """`marks_shown` hands back the very request exactly when no single text holds the mark, whatever
    the texts' ends are (a mark split across two texts is none)."""
    chunks = tuple(Chunk(f"c{i}", "".join(parts)) for i, parts in enumerate(texts))
    request = RerankRequest("q", chunks, 1, 0.7)
    shown = marks_shown(request)
    assert (shown is request) == (not any(ELISION.strip() in c.text for c in chunks))
    assert [c.text for c in shown.chunks] == [c.text.replace(ELISION.strip(), LITERAL_MARK) for c in chunks]


def test_the_cli_and_the_tool_take_the_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chunks = [_long_chunk(0, ANSWER, tokens=600), {"id": "short", "text": "A short note on vaccines."}]
    path = tmp_path / "chunks.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in chunks), encoding="utf-8")
    assert main(["rerank", "-q", QUERY, "-c", str(path), "--max-tokens-per-chunk", "64", "--meta"]) == 0
    meta = json.loads(capsys.readouterr().err)
    assert meta["evidence"]["doc-0"]["tokens_after"] <= 64
    assert main(["rerank", "-q", QUERY, "-c", str(path), "--max-tokens-per-chunk", "x"]) == 2
    out = call_tool({"query": QUERY, "chunks": chunks, "max_tokens_per_chunk": 64})
    assert "error" not in out and {r["id"] for r in out["ranked"]} <= {"doc-0", "short"}
    bad = call_tool({"query": QUERY, "chunks": chunks, "max_tokens_per_chunk": 3})
    assert bad["error"]["type"] == "invalid_input"


@given(st.text(max_size=300))
def test_the_fast_path_bound_is_never_below_the_estimate(text: str) -> None:
    """A request is passed through uncounted when this bound fits; it must never be an underestimate."""
    assert estimate_tokens(text) <= (len(text) if text.isascii() else 4 * len(text))


@settings(derandomize=True, max_examples=300)
@given(st.text(max_size=400))
@example("It\u2019s a mostly English passage with one curly quote.")
@example("e\u0301\u0301\u0301 \u00e2\u0080\u0099 \U0001f600\U0001f600 \u4e2d\u6587")
@example("a b c d e f g ! ? . , ; 1 2 3")
def test_the_fast_paths_bound_is_never_below_the_estimate(text: str) -> None:
    """`shorten` skips counting when the UTF-8 byte bound already fits: the bound must hold for
    any text, or a request over the budget would be sent whole."""
    assert most_tokens(text) >= estimate_tokens(text)


@settings(derandomize=True, max_examples=200)
@given(st.lists(st.text(max_size=40), max_size=6))
@example(["a", " ", "b"])
@example(["", "x"])
def test_piece_spans_locate_the_passages_a_scored_backend_scores(parts: list[str]) -> None:
    """`piece_spans` is where `passages_of`' pieces lie: what a scored backend reports as the passage
    that decided its score must be the text it scored."""
    text = ELISION.join(parts)
    pieces, _ = passages_of([text])
    assert [text[a:b] for a, b in piece_spans(text)] == pieces


@settings(derandomize=True, max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=600), st.integers(MIN_TOKENS_PER_CHUNK, 80), st.data())
@example("One. Two three. " * 30 + "Vaccine trial.", 16, None)
def test_a_span_of_the_shown_text_maps_to_the_same_characters_of_the_original(
        text: str, budget: int, data: st.DataObject | None) -> None:
    ev = select(QUERY, text, budget, count=estimate_tokens)
    for k, (a, b) in enumerate(piece_spans(ev.text) if ev.text else []):
        lo = a if data is None else data.draw(st.integers(a, b), label=f"start {k}")
        hi = b if data is None else data.draw(st.integers(lo, b), label=f"end {k}")
        got = original_span(ev, (lo, hi))
        if got is None:  # only a piece that is a kept passage's stretch holding the mark itself
            assert ELISION in text
            continue
        assert text[got[0]:got[1]] == ev.text[lo:hi]


@pytest.mark.parametrize("how", [{"window_size": 20}, {"consistency": 2}])
def test_the_deciding_passage_is_reported_through_windows_and_passes(how: dict[str, int]) -> None:
    """Windows (the final pass scores the survivors) and consistency passes carry the scored
    backend's deciding passage into meta.evidence as a call does."""
    chunks, _, second = _two_passages()
    many = chunks + [{"id": f"c{i}", "text": TOPICS[i % 4].format(i=i)} for i in range(40)]
    one = rerank(QUERY, chunks, top_k=1, max_tokens_per_chunk=32)
    result = rerank(QUERY, many, top_k=1, max_tokens_per_chunk=32, **how)
    assert result.meta.calls > 1  # windows and a final pass, or two passes
    entry = (result.meta.evidence or {})["doc-0"]
    assert entry["decided"] in entry["passages"]
    assert entry["decided"] == (one.meta.evidence or {})["doc-0"]["decided"]
    assert chunks[0]["text"][slice(*entry["decided"])] == second


@settings(derandomize=True, max_examples=300, deadline=None)
@given(query=st.text(max_size=40),
       parts=st.lists(st.tuples(st.text(max_size=8), st.text(max_size=200),
                                st.one_of(st.none(), st.floats(allow_nan=False)),
                                st.one_of(st.none(), st.dictionaries(st.text(max_size=4), st.text(max_size=9),
                                                                     max_size=2))),
                      min_size=1, max_size=6, unique_by=lambda p: p[0]),
       budget=st.integers(0, 600), cap=st.one_of(st.none(), st.integers(MIN_TOKENS_PER_CHUNK, 200)))
@example(query="q", parts=[("a", "It\u2019s " + "x" * 150, None, None)], budget=160, cap=None)
def test_the_fast_bounds_never_let_an_over_budget_prompt_through(
        query: str, parts: list[tuple[str, str, float | None, dict[str, str] | None]], budget: int,
        cap: int | None) -> None:
    """`tokens_over` (the input guard's check) skips counting when a byte bound fits, and `shorten`
    passes a request through uncut on the same bound: both must agree with the exact count."""
    chunks = [Chunk(i, t, s, m) for i, t, s, m in parts]
    need = prompt_tokens(query, chunks)
    assert tokens_over(query, chunks, budget) == (need if need > budget else None)
    request = RerankRequest(query=query, chunks=tuple(chunks), top_k=1, lambda_=0.7)
    within_cap = all(cap is None or estimate_tokens(c.text) <= cap for c in chunks)
    try:
        out = shorten(request, max_context_tokens=budget, max_tokens_per_chunk=cap, strict=False,
                      window_size=None)
    except InputError:
        assert need > budget  # refused only when over the budget as counted
        return
    assert (out.request == request and not out.evidence) == (need <= budget and within_cap)


def test_plan_counts_the_shortened_prompt() -> None:
    """`plan()` prices the prompt the model will be sent: with a cap, the chunk's evidence, not its text."""
    chunks = [_long_chunk(0, ANSWER, tokens=600), {"id": "short", "text": "A short note on vaccines."}]
    llm = {"backend": "openai", "model": "gpt-4o-mini", "api_key": "sk-not-used"}  # plan() sends nothing
    whole = plan(QUERY, chunks, top_k=2, **llm).prompt_tokens
    capped = plan(QUERY, chunks, top_k=2, max_tokens_per_chunk=64, **llm).prompt_tokens
    saved = estimate_tokens(chunks[0]["text"]) - 64
    assert whole - capped >= saved * 0.9  # about the tokens cut (the elision marks and rounding aside)


def test_the_service_takes_max_tokens_per_doc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cohere's `max_tokens_per_doc` on the service is the library's `max_tokens_per_chunk`: the
    upstream LLM (the fake server) is sent the long document's evidence, not the document."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from rag_rerank.service.app import create_app
    from rag_rerank.service.config import parse_config
    from tests.support.fake_llm import auto_ranker
    from tests.support.service import running

    long = _long_chunk(0, ANSWER, tokens=600)["text"]
    docs = [long, "A short note on vaccines."]
    monkeypatch.setenv("W34_TEST_UPSTREAM_KEY", "sk-test")
    with FakeLLM(handler=auto_ranker()) as llm:
        upstream = {"backend": "openai", "model": "fake-gpt", "base_url": llm.openai_url,
                    "api_key_env": "W34_TEST_UPSTREAM_KEY"}
        config = parse_config({"models": {"llm": upstream}})
        with running(create_app(config)) as url:
            body = {"model": "llm", "query": QUERY, "documents": docs, "max_tokens_per_doc": 64}
            r = httpx.post(f"{url}/v2/rerank", json=body, timeout=60)
            whole = httpx.post(f"{url}/v2/rerank", json={**body, "max_tokens_per_doc": None}, timeout=60)
    assert r.status_code == 200 and whole.status_code == 200, r.text
    ours = r.json()["rag_rerank"]
    assert ours["max_tokens_per_doc"] == {"value": 64, "applied": True, "option": "max_tokens_per_chunk"}
    assert sorted(x["index"] for x in ours["ranked"] + ours["dropped"]) == [0, 1]
    shortened, sent_whole = llm.requests[0].prompt, llm.requests[-1].prompt
    assert ANSWER in shortened and long not in shortened and long in sent_whole


@pytest.mark.parametrize("count", [None, -5, "12", 1.5, True])
@pytest.mark.parametrize("strict", [False, True])
def test_a_tokenizer_returning_no_count_is_named(count: object, strict: bool) -> None:
    """Regression (QA): a tokenizer returning None raised a bare TypeError; one returning -5 made
    every chunk fit, so ~110k tokens went to the model without a word."""
    chunks = [{"id": f"c{i}", "text": "word " * 4000} for i in range(3)]
    with pytest.raises(InputError) as caught:
        rerank("word", chunks, max_tokens_per_chunk=None if strict else 64, strict=strict,
               tokenizer=lambda text: count)
    (violation,) = caught.value.violations
    assert violation.path == "tokenizer" and repr(count) in violation.message


def _surely_fits_by_passes(query: str, chunks: list[Chunk], max_context_tokens: int, cap: int | None) -> bool:
    """The bound as it was written before issue 37's fourth round: six passes of `map` over the chunks."""
    import json as json_
    from itertools import filterfalse
    from operator import attrgetter

    def utf8(texts: list[str]) -> int:
        wide = list(filterfalse(str.isascii, texts))
        return sum(map(len, texts)) + (sum(map(most_tokens, wide)) - sum(map(len, wide)) if wide else 0)

    texts = list(map(attrgetter("text"), chunks))
    total = most_tokens(query) + utf8(list(map(attrgetter("id"), chunks)))
    total += 32 * (len(chunks) - list(map(attrgetter("score"), chunks)).count(None))
    for meta in filter(None, map(attrgetter("meta"), chunks)):
        try:
            total += most_tokens(json_.dumps(meta, ensure_ascii=False, default=str))
        except (TypeError, ValueError, RecursionError):
            return False
    if cap is not None:
        sizes = list(map(most_tokens, texts))
        return not (sizes and max(sizes) > cap) and total + sum(sizes) <= max_context_tokens
    wide = list(filterfalse(str.isascii, texts))
    total += sum(map(len, texts))
    wide_chars = sum(map(len, wide))
    if total + 3 * wide_chars <= max_context_tokens:
        return True
    return bool(wide) and total + sum(map(most_tokens, wide)) - wide_chars <= max_context_tokens


_BOUND_CHUNKS = st.lists(st.builds(
    Chunk, st.text(min_size=1, max_size=6),
    st.one_of(st.text(max_size=40), st.sampled_from(["a […] b", "[…]", "[ü…]", "plain"])),
    st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
    st.one_of(st.none(), st.just({}), st.dictionaries(st.text(max_size=3), st.text(max_size=5), max_size=2),
              st.just({"set": {1}}), st.just({(1, 2): "a key json refuses"}))), max_size=8)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.text(max_size=20), _BOUND_CHUNKS, st.one_of(st.none(), st.integers(min_value=0, max_value=60)))
@example("q", [Chunk("é", "ü" * 30)], None)  # over by the rough bound, within by the bytes for some budgets
@example("q", [Chunk("a", "x", meta={(1, 2): "t"})], None)
@example("q", [Chunk("a", "x", 0.5), Chunk("b", "y", meta={"k": "v"})], 3)
def test_the_sure_fit_in_one_loop_answers_as_the_six_passes_did(query: str, chunks: list[Chunk],
                                                                  cap: int | None) -> None:
    """`_sure_fit` reads every chunk in one loop (issue 37): for any chunks (ids and texts in any
    Unicode, scores, metadata that does or does not serialise), any cap and every budget up to past
    the largest bound they can need (so each threshold is crossed), the same answer as the six
    passes over the texts `marks_shown` made, and when it fits, whether `marks_shown` has a mark to show."""
    from rag_rerank.shortening import _sure_fit, _surely_fits

    shown = list(marks_shown(RerankRequest(query, tuple(chunks), 1, 0.7)).chunks)
    marked = any(ELISION.strip() in c.text for c in chunks)
    for budget in range(0, 1400):
        fits, said = _sure_fit(query, chunks, budget, cap)
        assert fits == _surely_fits(query, chunks, budget, cap)
        assert fits == _surely_fits_by_passes(query, shown, budget, cap)
        assert not fits or said == marked
