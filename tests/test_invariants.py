"""Property tests: the contract holds for any valid input, whatever its Unicode, on every surface.

Why: DESIGN.md promises that valid input never raises "whatever its Unicode", that every input id
comes back byte for byte exactly once in ranked ∪ dropped, that at most top_k are ranked with
scores in [0, 1] strictly above the minimum score in force, that no two ranked chunks are
near-duplicates, and that the local backend is deterministic. Hand-picked examples cannot cover
what retrievers really hand over (mojibake with C1 controls, NFD accents, zero-width and bidi
characters, BOMs, ligatures, emoji, mixed scripts), so Hypothesis generates it: arbitrary Unicode
(controls and combining marks included, surrogates excluded), real-looking words mangled the ways
web text is mangled, NFD / mojibake copies of other chunks (near-duplicates on purpose), arbitrary
unique ids, top_k, lambda and the min_score limit.

Every surface that runs the pipeline is driven as its users drive it: `rerank`, `arerank`,
windows, `arerank_many`, the tool call, the LangChain / LlamaIndex / Haystack components with their
own document types, and the `openai` backend over real HTTP against the scripted server on
127.0.0.1 (answering like a careful model: valid card-format JSON built from the prompt). Input the
input guard must refuse raises `InputError` and nothing else.
"""

from __future__ import annotations

import asyncio
import html
import json
import math
import os
import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")

from hypothesis import Phase, given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rag_rerank import arerank, arerank_many, rerank  # noqa: E402
from rag_rerank.errors import InputError, RerankError  # noqa: E402
from rag_rerank.guard.output import cites_chunk  # noqa: E402
from rag_rerank.models import RerankResult  # noqa: E402
from rag_rerank.retry import RetryPolicy  # noqa: E402
from rag_rerank.text import comparable  # noqa: E402
from rag_rerank.tools import call_tool  # noqa: E402
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply  # noqa: E402
from tests.support.invariants import TOLERANCE, assert_contract, violations  # noqa: E402

DEFAULT_MIN_SCORE = 0.2  # guard/limits.json

# One failure per test, reported as found. Shrinking a failing pipeline example costs thousands of
# further calls (minutes per test on 2 cores, 9 minutes for this file), and every test here drives
# the same pipeline, so the file would be slowest exactly when someone is fixing it. The failing
# example is printed and saved in Hypothesis' database either way (a rerun replays it at once);
# HYPOTHESIS_PROFILE=thorough, the profile for hunting a bug, also shrinks it to a minimal one.
_SHRINK = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
one_bug = settings(report_multiple_bugs=False,
                   phases=tuple(p for p in Phase if _SHRINK or p not in (Phase.shrink, Phase.explain)))

# --------------------------------------------------------------------------------------- strategies

# The whole of Unicode but surrogates: controls, combining marks, private use, unassigned.
ANY_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=60)

WORDS = (
    "bluetooth", "secure", "pairing", "encryption", "fairly", "vector", "index", "memory", "HNSW",
    "IVF", "latency", "recall", "café", "naïve", "résumé", "Straße", "coöperate", "Zürich", "München",
    "São", "Paulo", "ﬁle", "Ωhm", "東京都", "検索", "日本語", "שלום", "עולם", "Москва", "поиск", "Ελλάδα",
    "ΣΟΦΙΑΣ", "İstanbul", "1,000", "2024", "42%", "3.14", "e-mail", "don't", "U.S.",
)
MANGLERS = (
    # mojibake: UTF-8 quotes, apostrophe, é and no-break space read as Latin-1
    "\u00e2\u0080\u009c", "\u00e2\u0080\u009d", "\u00e2\u0080\u0099", "\u00c3\u00a9", "\u00c2\u00a0",
    "\u0301", "\u0308",  # combining accents
    "\u200b", "\u200d", "\u2060",  # zero-width
    "\u202e", "\u202d", "\u2066",  # bidi
    "\ufeff", "\u00ad", "\ufffd",  # BOM, soft hyphen, replacement char
    "😀", "👍🏽", "👩‍💻", "🇫🇷",  # emoji, modifiers, ZWJ sequence, flag
    "\ufb01", "\u2126", "\u212b", "\u2163", "\uff21",  # ligature, Ohm, Angstrom, roman numeral, fullwidth
    "\u0085", "\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\r\n", "\t", "\x00", "\x7f",  # breaks, controls
    "\U000e0041", "\U0010fffd",  # a tag character, private use plane 16
)
C1 = st.characters(min_codepoint=0x80, max_codepoint=0x9F)
TOKEN = st.one_of(st.sampled_from(WORDS), st.sampled_from(WORDS), st.sampled_from(MANGLERS), C1,
                  st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=3))
SEPARATOR = st.sampled_from([" ", " ", " ", "", "\n", ", ", ". "])
MANGLED = st.lists(st.tuples(TOKEN, SEPARATOR), max_size=20).map(lambda ps: "".join(t + s for t, s in ps))


def mojibake(text: str) -> str:
    """UTF-8 bytes read as Latin-1: the C1-control mojibake of real web text ('â\\x80\\x9c')."""
    return text.encode("utf-8").decode("latin-1")


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


# How a copy of another chunk's text may come back from a crawler: verbatim, in another Unicode
# form, as mojibake, shouted, re-spaced. Each is a near-duplicate of its source (or a copy).
TRANSFORMS: tuple[Callable[[str], str], ...] = (
    lambda t: t, nfd, lambda t: unicodedata.normalize("NFKC", t), mojibake, str.upper,
    lambda t: "  ".join(t.split()), lambda t: t + " \u200b",
)

TEXT = st.one_of(ANY_TEXT, MANGLED, MANGLED.map(nfd), MANGLED.map(mojibake))
QUERY = st.one_of(MANGLED, MANGLED.map(nfd), MANGLED.map(mojibake), ANY_TEXT).filter(
    lambda q: bool(q.strip()))  # a blank query is refused (see the invalid-input test)
ID = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12),
    st.sampled_from(["a", "A", "é", "e\u0301", " a", "a ", "\u200b", "1", "c1", "\ufeffc1", "ﬁ", "fi",
                     "redundant_with:a", "id\u0000x", "\u202eabc"]),
)
LAMBDA = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
MIN_SCORE = st.one_of(st.none(), st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
                      st.sampled_from([0.0, 0.2, 0.5, 0.99, 1.0]))


@st.composite
def chunk_lists(draw: st.DrawFn, min_size: int = 1, max_size: int = 12) -> list[dict[str, str]]:
    """Unique ids; texts from `TEXT`, and now and then a transformed copy of an earlier chunk."""
    n = draw(st.integers(min_size, max_size))
    ids = draw(st.lists(ID, min_size=n, max_size=n, unique=True))
    texts: list[str] = []
    for i in range(n):
        if i and draw(st.integers(0, 4)) == 0:
            source = texts[draw(st.integers(0, i - 1))]
            texts.append(draw(st.sampled_from(TRANSFORMS))(source))
        else:
            texts.append(draw(TEXT))
    return [{"id": cid, "text": text} for cid, text in zip(ids, texts, strict=True)]


@dataclass(frozen=True)
class Req:
    """One request as a caller writes it; `min_score` None means the contract's default."""

    query: str
    chunks: list[dict[str, str]]
    top_k: int
    lambda_: float
    min_score: float | None = None
    window_size: int | None = None

    @property
    def floor(self) -> float:
        return DEFAULT_MIN_SCORE if self.min_score is None else self.min_score

    @property
    def limits(self) -> dict[str, float] | None:
        return None if self.min_score is None else {"min_score": self.min_score}

    def kwargs(self) -> dict[str, Any]:
        """`rerank()` keyword arguments besides query and chunks."""
        out: dict[str, Any] = {"top_k": self.top_k, "lambda_": self.lambda_, "limits": self.limits}
        if self.window_size is not None:
            out["window_size"] = self.window_size
        return out


@st.composite
def requests(draw: st.DrawFn, max_chunks: int = 12) -> Req:
    chunks = draw(chunk_lists(max_size=max_chunks))
    return Req(draw(QUERY), chunks, draw(st.integers(1, 15)), draw(LAMBDA), draw(MIN_SCORE))


@st.composite
def windowed_requests(draw: st.DrawFn) -> Req:
    """More chunks than one window, so windows and a final pass really run."""
    window = draw(st.integers(2, 8))
    chunks = draw(chunk_lists(min_size=window + 1, max_size=3 * window + 1))
    top_k = draw(st.integers(1, window))
    return Req(draw(QUERY), chunks, top_k, draw(LAMBDA), draw(MIN_SCORE), window_size=window)


def check(result: RerankResult | dict[str, Any], req: Req) -> None:
    note(f"result: {result.to_json() if isinstance(result, RerankResult) else json.dumps(result)}")
    assert_contract(result, req.chunks, req.top_k, req.floor)


# ------------------------------------------------------------------------------- the local backend


@one_bug
@given(requests())
def test_rerank_keeps_the_contract(req: Req) -> None:
    """`rerank` with the default local backend never raises on valid input and keeps every promise."""
    check(rerank(req.query, req.chunks, **req.kwargs()), req)


@one_bug
@given(requests())
def test_arerank_keeps_the_contract_and_answers_as_rerank_does(req: Req) -> None:
    """`arerank` is `rerank` for asyncio: same contract, and (local backend) the very same answer."""
    result = asyncio.run(arerank(req.query, req.chunks, **req.kwargs()))
    check(result, req)
    assert result.to_json() == rerank(req.query, req.chunks, **req.kwargs()).to_json()


@one_bug
@given(requests())
def test_same_input_gives_the_identical_output(req: Req) -> None:
    """The local backend is deterministic: a second call gives the identical JSON, byte for byte,
    and the caller's records are only read (the second call sees the same input as the first)."""
    before = json.dumps(req.chunks)
    first = rerank(req.query, req.chunks, **req.kwargs()).to_json()
    assert json.dumps(req.chunks) == before
    assert rerank(req.query, req.chunks, **req.kwargs()).to_json() == first


# Words of one subject, so that the local backend scores the chunks above the minimum.
TOPIC = ("vector", "index", "memory", "latency", "recall", "cluster", "shard", "replica", "cache", "disk",
         "graph", "quantised", "partition", "probe", "search")
# Copies a crawler returns that are not byte-identical (so `candidate_k` does not count them).
RESPELT: tuple[Callable[[str], str], ...] = (
    nfd, str.upper, str.lower, lambda t: "  ".join(t.split()), lambda t: t + " \u200b", lambda t: t + "!!",
    lambda t: "\n" + t.title(),
)


@st.composite
def crowded_requests(draw: st.DrawFn) -> Req:
    """A list where the merges exceed `candidate_k`: more respelt copies of a few chunks than the
    candidates leave room for (none byte-identical, so `candidate_k` does not count them), then
    other chunks on the query's subject waiting behind them."""
    words = draw(st.lists(st.sampled_from(TOPIC), min_size=3, max_size=3, unique=True))
    rest = [w for w in TOPIC if w not in words]

    def sentence(extra: int) -> str:
        more = draw(st.lists(st.sampled_from(rest), min_size=extra, max_size=extra, unique=True))
        return " ".join(words + more).capitalize() + "."

    heads = [sentence(1) for _ in range(draw(st.integers(1, 3)))]
    texts = [draw(st.sampled_from(RESPELT))(head) + " " * k
             for head in heads for k in range(draw(st.integers(2, 12)))]
    texts += [sentence(2) for _ in range(draw(st.integers(2, 8)))]
    order = draw(st.permutations(range(len(texts))))
    chunks = [{"id": f"c{i}", "text": texts[j]} for i, j in enumerate(order)]
    top_k = draw(st.integers(1, 6))
    return Req(" ".join(words), chunks, top_k, draw(LAMBDA), draw(st.sampled_from([None, 0.0])))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(crowded_requests())
def test_no_short_list_while_a_scored_chunk_waits(req: Req) -> None:
    """Issue 32: with the local (scored) backend, merges that use up the candidates never leave a
    slot empty while a chunk scored above the minimum waits: len(ranked) == min(top_k, the chunks
    above the minimum that are neither redundant with a ranked one nor unquotable)."""
    result = rerank(req.query, req.chunks, **req.kwargs())
    note(f"result: {result.to_json()}")
    problems = violations(result, req.chunks, req.top_k, req.floor, scored=True)
    assert not problems, problems
    if len(result.ranked) < req.top_k:
        assert any(n.startswith("short list:") for n in result.meta.notes), result.meta.notes


@one_bug
@given(windowed_requests())
def test_windows_keep_the_contract(req: Req) -> None:
    """With `window_size` smaller than the list: windows, a final pass, then the post-pass over all
    survivors; every id still accounted for, duplicates removed across windows, deterministic."""
    result = rerank(req.query, req.chunks, **req.kwargs())
    check(result, req)
    assert result.meta.calls > 1  # it really ran in windows
    assert rerank(req.query, req.chunks, **req.kwargs()).to_json() == result.to_json()


@one_bug
@given(st.lists(st.one_of(requests(max_chunks=8), windowed_requests()), min_size=1, max_size=4),
       st.integers(1, 3))
def test_batch_keeps_the_contract_and_answers_as_rerank_does(reqs: list[Req], concurrency: int) -> None:
    """`arerank_many` (the batch engine): one outcome per request, in order, none an exception, each
    keeping the contract under its own limits and equal to what `rerank` answers for it alone."""
    items: list[dict[str, Any]] = []
    for r in reqs:
        item: dict[str, Any] = {"query": r.query, "chunks": r.chunks, "top_k": r.top_k, "lambda": r.lambda_}
        if r.window_size is not None:
            item["window_size"] = r.window_size
        items.append(item)
    # limits are a run-wide option of a batch: one min_score for all its requests
    floor = reqs[0].min_score
    reqs = [Req(r.query, r.chunks, r.top_k, r.lambda_, floor, r.window_size) for r in reqs]
    options = {} if floor is None else {"limits": {"min_score": floor}}
    outcomes = asyncio.run(arerank_many(items, concurrency=concurrency, **options))
    assert len(outcomes) == len(reqs)
    errors = [f"request {i}: {type(o).__name__}: {o}"
              for i, o in enumerate(outcomes) if isinstance(o, Exception)]
    assert not errors, "\n".join(errors)
    for r, outcome in zip(reqs, outcomes, strict=True):
        assert isinstance(outcome, RerankResult)
        check(outcome, r)
        assert outcome.to_json() == rerank(r.query, r.chunks, **r.kwargs()).to_json()


@one_bug
@given(requests(), st.booleans())
def test_tool_call_keeps_the_contract(req: Req, as_json_text: bool) -> None:
    """`call_tool` as an agent calls it (a dict, or the JSON text a model emitted): the card's output
    object, never an error, for valid arguments."""
    args: dict[str, Any] = {"query": req.query, "chunks": req.chunks, "top_k": req.top_k,
                            "lambda": req.lambda_}
    options = {} if req.limits is None else {"limits": req.limits}
    out = call_tool(json.dumps(args) if as_json_text else args, **options)
    assert "error" not in out, out
    assert set(out) == {"ranked", "dropped"}
    check(out, req)


# ---------------------------------------------------------------------------- framework components


@pytest.fixture(scope="module", autouse=True)
def _no_haystack_telemetry() -> Iterator[None]:
    """Haystack reports every Pipeline.run to PostHog unless told not to; no test reaches the internet."""
    try:
        import haystack.telemetry._telemetry as telemetry
    except ImportError:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(telemetry, "telemetry", None)
        yield


def _component_options(req: Req) -> dict[str, Any]:
    return {} if req.limits is None else {"limits": req.limits}


def _same_scores(kept: list[tuple[str, float | None]], result: RerankResult) -> None:
    """The framework's kept items are the result's ranked entries, in order, with their scores."""
    assert [cid for cid, _ in kept] == [r.id for r in result.ranked]
    for (cid, score), r in zip(kept, result.ranked, strict=True):
        assert score is not None and math.isclose(score, r.score, rel_tol=0.0, abs_tol=TOLERANCE), cid


@one_bug
@given(requests(), st.booleans())
def test_langchain_compressor_keeps_the_contract(req: Req, use_async: bool) -> None:
    """`RagRerankCompressor` run as a LangChain Runnable step on Documents (sync and async)."""
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document

    from rag_rerank.integrations.langchain import RagRerankCompressor

    docs = [Document(page_content=c["text"], id=c["id"], metadata={"n": i}) for i, c in enumerate(req.chunks)]
    comp = RagRerankCompressor(top_n=req.top_k, lambda_=req.lambda_, **_component_options(req))
    step = {"query": req.query, "documents": docs}
    kept = asyncio.run(comp.ainvoke(step)) if use_async else comp.invoke(step)
    result = comp.last_result
    assert result is not None
    check(result, req)
    _same_scores([(d.id or "", d.metadata.get("relevance_score")) for d in kept], result)
    text_of = {c["id"]: c["text"] for c in req.chunks}
    assert [d.page_content for d in kept] == [text_of[d.id or ""] for d in kept]  # the caller's text, intact


@one_bug
@given(requests(), st.booleans())
def test_llama_index_postprocessor_keeps_the_contract(req: Req, use_async: bool) -> None:
    """`RagRerankPostprocessor` as LlamaIndex calls a node postprocessor, on TextNodes."""
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    from rag_rerank.integrations.llama_index import RagRerankPostprocessor

    nodes = [NodeWithScore(node=TextNode(id_=c["id"], text=c["text"]), score=1.0 - i / 100)
             for i, c in enumerate(req.chunks)]
    post = RagRerankPostprocessor(top_n=req.top_k, lambda_=req.lambda_, **_component_options(req))
    if use_async:
        kept = asyncio.run(post.apostprocess_nodes(nodes, query_bundle=QueryBundle(req.query)))
    else:
        kept = post.postprocess_nodes(nodes, query_str=req.query)
    result = post.last_result
    assert result is not None
    check(result, req)
    _same_scores([(n.node.node_id, n.score) for n in kept], result)


@one_bug
@given(requests())
def test_haystack_ranker_keeps_the_contract(req: Req) -> None:
    """`RagRerankRanker` inside a Haystack Pipeline, on Haystack Documents: its two outputs (kept
    and dropped Documents) account for every input Document, by id."""
    pytest.importorskip("haystack")
    from haystack import Document, Pipeline

    from rag_rerank.integrations.haystack import RagRerankRanker

    docs = [Document(id=c["id"], content=c["text"]) for c in req.chunks]
    pipe = Pipeline()
    ranker = RagRerankRanker(top_k=req.top_k, lambda_=req.lambda_, **_component_options(req))
    pipe.add_component("ranker", ranker)
    out = pipe.run({"ranker": {"query": req.query, "documents": docs}})["ranker"]
    as_result = {
        "ranked": [{"id": d.id, "score": d.score} for d in out["documents"]],
        "dropped": [{"id": d.id, "reason": d.meta.get("rerank_dropped_reason")} for d in out["dropped"]],
    }
    check(as_result, req)


# ------------------------------------------------------------------- the openai backend over HTTP

_CHUNKS = re.compile(r"<chunks>(.*?)</chunks>", re.DOTALL)
_QUERY = re.compile(r"<query>(.*?)</query>", re.DOTALL)
_TOP_K = re.compile(r"<top_k>(\d+)</top_k>")
_WORD = re.compile(r"\w+")


def _citable(text: str) -> list[str]:
    """Words of the chunk a reason can name as concrete: a number, a non-ASCII word of three or
    more characters, or an ASCII word of five or more (shorter ASCII words are mostly function
    words like "the", which name nothing); taken from the text as a reader sees it (invisible
    characters such as a soft hyphen are not word breaks: `text.comparable`), longest first. A
    careful model does not offer a word that says only that a chunk is relevant ("passages",
    "relevant": the output guard rightly refuses a reason naming nothing else), so each word is
    one the guard counts as a citation of this chunk (`cites_chunk`)."""
    words = _WORD.findall(comparable(text))
    keep = {w for w in words if (any(ch.isdigit() for ch in w) or len(w) >= (5 if w.isascii() else 3))
            and cites_chunk(f"names {w}", text)}
    return sorted(keep, key=lambda w: (-len(w), w))[:4]


@dataclass
class CardModel:
    """A FakeLLM handler answering like a careful model: valid card-format JSON built from the prompt.

    It reads the query, the chunk records and top_k from the rendered task, scores each chunk by
    its word overlap with the query and its position, ranks at most top_k chunks that it can give a
    concrete reason for (naming words of the chunk, without quotation marks), each strictly above
    the minimum score it was told (`min_score`), and drops every other one with a grammar token.
    """

    min_score: float = DEFAULT_MIN_SCORE
    prompts: list[str] = field(default_factory=list)

    def answer(self, prompt: str) -> dict[str, Any]:
        query = html.unescape(m.group(1)) if (m := _QUERY.search(prompt)) else ""
        top_k = int(m.group(1)) if (m := _TOP_K.search(prompt)) else 5
        body = m.group(1) if (m := _CHUNKS.search(prompt)) else ""
        records = [json.loads(line) for line in body.split("\n") if line.strip()]
        q_words = set(_WORD.findall(query.lower()))
        scored: list[tuple[float, int, str, list[str]]] = []
        for i, rec in enumerate(records):
            words = _citable(rec["text"])
            overlap = len(q_words & set(_WORD.findall(rec["text"].lower())))
            share = max(0.05, 0.4 + 0.6 * overlap / (overlap + 1) - 0.3 * i / max(1, len(records)))
            scored.append((self._above_floor(share), i, rec["id"], words))
        scored.sort(key=lambda t: (-t[0], t[1]))
        ranked: list[dict[str, Any]] = []
        dropped: list[dict[str, str]] = []
        for score, _, cid, words in scored:
            if score > self.min_score and words and len(ranked) < top_k:
                ranked.append({"id": cid, "score": score, "reason": "names " + ", ".join(words)})
            elif score > self.min_score and words:
                dropped.append({"id": cid, "reason": "not_selected"})
            else:
                dropped.append({"id": cid, "reason": "below_min_score"})
        return {"ranked": ranked, "dropped": dropped}

    def _above_floor(self, share: float) -> float:
        """A score in (min_score, 1] for a share in (0, 1]; 0.0 when no such score exists."""
        score = self.min_score + (1.0 - self.min_score) * share
        if self.min_score < score <= 1.0:
            return score
        return 1.0 if self.min_score < 1.0 else 0.0

    def __call__(self, req: RecordedRequest) -> Reply:
        self.prompts.append(req.prompt)
        return Reply.openai_text(json.dumps(self.answer(req.prompt), ensure_ascii=False))


@pytest.fixture(scope="module")
def card_llm() -> Iterator[tuple[FakeLLM, CardModel]]:
    model = CardModel()
    with FakeLLM(handler=model) as srv:
        yield srv, model


FAST = RetryPolicy(max_attempts=2, max_reasks=1, deadline_s=20.0, initial_wait_s=0.01, max_wait_s=0.02,
                   jitter_s=0.0)


@one_bug
@given(st.one_of(requests(), windowed_requests()))
def test_openai_backend_keeps_the_contract(card_llm: tuple[FakeLLM, CardModel], req: Req) -> None:
    """The `openai` backend, the real openai SDK over HTTP to a server answering valid card-format
    JSON: the prompt carries every chunk's text intact through the wire, the output guard accepts a
    valid answer, and the post-pass keeps the contract."""
    srv, model = card_llm
    model.min_score = req.floor
    result = rerank(req.query, req.chunks, backend="openai", base_url=srv.openai_url, api_key="sk-test-0000",
                    model="fake-gpt", policy=FAST, **req.kwargs())
    check(result, req)
    assert result.meta.fallback is None and result.meta.backend == "openai"


# ---------------------------------------------------------------------------------- invalid input

SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
Invalid = tuple[str, Any, Any, dict[str, Any]]  # (what is wrong, query, chunks, other keywords)


@st.composite
def invalid_requests(draw: st.DrawFn) -> Invalid:
    """(what is wrong, query, chunks, other rerank() keywords): a valid request with one thing the
    input guard must refuse. Only rules the contract states (guard/limits.json, the chunk schema,
    docs/errors.md) are broken: no borderline guess about what the guard might accept."""
    req = draw(requests(max_chunks=6))
    query: Any = req.query
    chunks: Any = [dict(c) for c in req.chunks]
    kwargs: dict[str, Any] = {"top_k": req.top_k, "lambda_": req.lambda_}
    kind = draw(st.sampled_from([
        "surrogate in text", "surrogate in id", "surrogate in query", "blank query", "query too long",
        "query not a string", "too many chunks", "too many chunks for windows", "over the token budget",
        "over a small budget", "duplicate id", "empty id", "id not a string", "text missing",
        "text not a string", "no chunks", "bad top_k", "bad lambda", "bad min_score", "bad window_size",
        "window_size below top_k",
    ]))
    pos = draw(st.integers(0, len(chunks) - 1))
    surrogate = draw(SURROGATE)
    if kind == "surrogate in text":
        text = chunks[pos]["text"]
        at = draw(st.integers(0, len(text)))
        chunks[pos]["text"] = text[:at] + surrogate + text[at:]
    elif kind == "surrogate in id":
        chunks[pos]["id"] = chunks[pos]["id"] + surrogate
    elif kind == "surrogate in query":
        query = query + surrogate
    elif kind == "blank query":
        query = draw(st.sampled_from(["", " ", "\t\n", "\u3000", "\x1c\x1d", "\u2028", " \r\n "]))
    elif kind == "query too long":
        query = "q" * 4001
    elif kind == "query not a string":
        query = draw(st.sampled_from([None, 5, ["a"], b"query"]))
    elif kind == "too many chunks":
        chunks = [{"id": f"c{i}", "text": "t"} for i in range(51)]
    elif kind == "too many chunks for windows":
        chunks = [{"id": f"c{i}", "text": "t"} for i in range(1001)]
        kwargs["window_size"] = 50
        kwargs["top_k"] = min(req.top_k, 50)
    elif kind == "over the token budget":
        # 40,000 words: over 32,000 tokens as the one estimator counts them (a short word is a token;
        # not characters / 4 any more). Refused with strict only: otherwise the chunk is shown as its
        # evidence (tests/test_shortening.py).
        chunks[pos]["text"] = "word " * 40_000
        kwargs["strict"] = True
    elif kind == "over a small budget":
        chunks[pos]["text"] = chunks[pos]["text"] + "x" * 400
        kwargs["limits"] = {"max_context_tokens": 50}
        kwargs["strict"] = True
    elif kind == "duplicate id":
        chunks.append({"id": chunks[pos]["id"], "text": draw(TEXT)})
    elif kind == "empty id":
        chunks[pos]["id"] = ""
    elif kind == "id not a string":
        chunks[pos]["id"] = draw(st.sampled_from([5, None, 1.5, ["a"]]))
    elif kind == "text missing":
        del chunks[pos]["text"]
    elif kind == "text not a string":
        chunks[pos]["text"] = draw(st.sampled_from([5, ["a"], {"t": 1}, True]))
    elif kind == "no chunks":
        chunks = []
    elif kind == "bad top_k":
        kwargs["top_k"] = draw(st.sampled_from([0, -1, True, 1.5, "3", float("nan")]))
    elif kind == "bad lambda":
        kwargs["lambda_"] = draw(st.sampled_from([-0.01, 1.01, float("nan"), float("inf"), "0.5", True]))
    elif kind == "bad min_score":
        kwargs["limits"] = {"min_score": draw(st.sampled_from([-0.1, 1.5, float("nan"), "0.3"]))}
    elif kind == "bad window_size":
        kwargs["window_size"] = draw(st.sampled_from([0, -5, 51, 2.5, "10"]))
    else:  # window_size below top_k
        kwargs["top_k"] = max(2, req.top_k)
        kwargs["window_size"] = kwargs["top_k"] - 1
    return kind, query, chunks, kwargs


@one_bug
@given(invalid_requests())
def test_refused_input_raises_input_error_and_nothing_else(case: Invalid) -> None:
    """Bad input gets an `InputError` (a `RerankError`) naming the problem: never a crash from deeper
    in the pipeline, never a silent result. The tool call answers `invalid_input` instead of raising."""
    kind, query, chunks, kwargs = case
    note(f"mutation: {kind}")
    with pytest.raises(RerankError) as caught:
        rerank(query, chunks, **kwargs)
    assert isinstance(caught.value, InputError), f"{kind}: {type(caught.value).__name__}: {caught.value}"
    assert caught.value.violations, kind
    if "limits" in kwargs or "strict" in kwargs:
        return  # an operator's option, not a tool argument
    args = {"query": query, "chunks": chunks, "top_k": kwargs["top_k"], "lambda": kwargs["lambda_"],
            "window_size": kwargs.get("window_size")}
    out = call_tool({k: v for k, v in args.items() if k != "window_size" or v is not None})
    assert out.get("error", {}).get("type") == "invalid_input", f"{kind}: {out}"


@pytest.mark.parametrize(("ranked", "dropped", "expected"), [
    ([("a", 0.9)], [("b", "not_selected")], "missing"),
    ([("a", 0.9), ("b", 0.8), ("c", 0.7)], [("a", "not_selected")], "more than once"),
    ([("a", 0.9), ("b", 0.8), ("c", 0.7), ("d", 0.6)], [], "more than top_k"),
    ([("a", 0.2)], [("b", "x"), ("c", "x"), ("d", "x")], "not above the minimum"),
    ([("a", 1.5)], [("b", "x"), ("c", "x"), ("d", "x")], "not a finite number in [0, 1]"),
    ([("a", float("nan"))], [("b", "x"), ("c", "x"), ("d", "x")], "not a finite number in [0, 1]"),
    ([("A", 0.9)], [("b", "x"), ("c", "x"), ("d", "x")], "not, byte for byte, an input id"),
    ([("a", 0.9)], [("b", "redundant_with:c"), ("c", "x"), ("d", "x")], "does not name a ranked id"),
    ([("a", 0.9), ("c", 0.8)], [("b", "x"), ("d", "x")], "are copies"),
    ([("b", 0.9), ("d", 0.8)], [("a", "x"), ("c", "x")], "are redundant"),
])
def test_checker_rejects_a_broken_result(ranked: list[tuple[str, float]], dropped: list[tuple[str, str]],
                                         expected: str) -> None:
    """The checker itself can fail: each broken promise is reported, so a green run of the tests
    above means the promises were checked, not that the checker was blind."""
    chunks = [{"id": "a", "text": "Bluetooth pairing is fairly secure."},
              {"id": "b", "text": "IVF uses less memory than HNSW, so prefer it when RAM is constrained."},
              {"id": "c", "text": "bluetooth  PAIRING is fairly secure!"},  # a copy of a
              {"id": "d", "text": "IVF uses less memory than HNSW, so prefer it when RAM is constrianed."}]
    result = {"ranked": [{"id": i, "score": s} for i, s in ranked],
              "dropped": [{"id": i, "reason": r} for i, r in dropped]}
    found = violations(result, chunks, 3)
    assert any(expected in v for v in found), found
    clean = {"ranked": [{"id": "a", "score": 0.9}, {"id": "b", "score": 0.8}],
             "dropped": [{"id": "c", "reason": "redundant_with:a"},
                         {"id": "d", "reason": "redundant_with:b"}]}
    assert violations(clean, chunks, 3) == []
