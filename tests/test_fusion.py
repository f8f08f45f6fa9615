"""Metadata fusion and embed_meta_fields, end to end with the local backend (and the prompt an LLM
backend receives, through the real openai SDK against the scripted server)."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from rag_rerank import arerank, arerank_many, rerank
from rag_rerank.cli import main
from rag_rerank.errors import InputError
from rag_rerank.fusion import _extended_iso, _parse_date, fuse, meta_fusion
from rag_rerank.models import Dropped, Ranked
from rag_rerank.render import extract_chunk_lines
from rag_rerank.tools import call_tool
from tests.support.fake_llm import FakeLLM, auto_ranker

QUERY = "how does vector search with an IVF index work"
# Every chunk is on topic (all rank), the most relevant one is the oldest, the newest is the weakest.
CHUNKS: list[dict[str, Any]] = [
    {"id": "old", "text": "How an IVF index works for vector search: vectors are partitioned into Voronoi "
     "cells and a query scans only the nearest lists.", "meta": {"published": "2019-03-01", "stars": 5}},
    {"id": "mid", "text": "Probing more cells with nprobe raises IVF recall in vector search, at some cost "
     "in latency.", "meta": {"published": "2022-07-15T10:00:00Z", "stars": "3"}},
    {"id": "new", "text": "This year several engines added IVF support to their vector search products.",
     "meta": {"published": "2025-01-20T08:30:00+01:00", "stars": 1}},
    {"id": "none", "text": "Centroids of an IVF index live in memory while posting lists may stay on disk.",
     "meta": {}},
]


def _run(**kw: Any) -> Any:
    return rerank(QUERY, copy.deepcopy(CHUNKS), 4, 1.0, **kw)


def test_date_field_with_weight_1_puts_the_newest_first_and_weight_0_changes_nothing() -> None:
    plain = _run()
    assert set(plain.ids) == {"old", "mid", "new", "none"} and plain.ids[0] != "new"
    newest = _run(meta_field="published", meta_value_type="date")
    assert newest.ids == ["new", "mid", "old", "none"]  # missing_meta="bottom": the dateless one last
    # scores stay the scorer's, handed out in the fused order, all above the minimum
    assert [r.score for r in newest.ranked] == sorted((r.score for r in plain.ranked), reverse=True)
    assert any("meta_fusion: field=published" in n for n in newest.meta.notes)
    for mode in ("reciprocal_rank_fusion", "linear_score"):
        off = _run(meta_field="published", meta_value_type="date", meta_weight=0, meta_ranking_mode=mode)
        assert off.to_dict() == plain.to_dict()
    oldest = _run(meta_field="published", meta_value_type="date", meta_sort_order="ascending",
                  missing_meta="top")
    assert oldest.ids == ["none", "old", "mid", "new"]


def test_missing_meta_drop_names_the_field_and_every_id_is_accounted_for() -> None:
    result = _run(meta_field="published", meta_value_type="date", missing_meta="drop")
    assert result.ids == ["new", "mid", "old"]
    assert [d.to_dict() for d in result.dropped] == [{"id": "none", "reason": "missing_meta: published"}]


def test_partial_weight_blends_the_two_orders() -> None:
    # relevance order: old, mid, new, none; date order: new, mid, old, none (missing: bottom)
    assert _run().ids == ["old", "mid", "new", "none"]
    half = {"meta_field": "published", "meta_value_type": "date", "meta_weight": 0.5}
    # RRF uses ranks only: old (1st, 3rd) and new (3rd, 1st) tie and the scorer breaks it; both
    # beat mid (2nd, 2nd) since 1/61 + 1/63 > 2/62
    assert _run(**half).ids == ["old", "new", "mid", "none"]
    # linear_score uses the score's size: scores old 0.953, mid 0.722, new 0.709, rescaled from (0.2, 1]
    # to 0.941, 0.653, 0.636; with date m = 1/3, 2/3, 1: new 0.818 > mid 0.660 > old 0.637, so the
    # date lead outweighs old's relevance lead and mid's near-tie with new in score (unlike RRF's ranks)
    assert _run(**half, meta_ranking_mode="linear_score").ids == ["new", "mid", "old", "none"]


def test_fuse_ranks_ties_and_linear_scores() -> None:
    ranked = [Ranked("a", 0.9, "r"), Ranked("b", 0.6, "r"), Ranked("c", 0.5, "r"), Ranked("d", 0.5, "r")]
    values = {"a": 1.0, "b": 3.0, "c": 3.0, "d": None}
    f = meta_fusion("v", meta_weight=1.0, meta_ranking_mode="linear_score")
    assert f is not None
    out, dropped = fuse(ranked, [Dropped("x", "below_min_score")], values, f, 0.2)
    # b and c tie on the value (shared rank): the scorer's order breaks it; d (missing) goes last
    assert [r.id for r in out] == ["b", "c", "a", "d"]
    assert [r.score for r in out] == [0.9, 0.6, 0.5, 0.499]  # strictly decreasing, above the minimum
    assert dropped == [Dropped("x", "below_min_score")]


def test_unparseable_values_are_an_input_error_naming_each_chunk() -> None:
    bad = copy.deepcopy(CHUNKS)
    bad[0]["meta"]["published"] = "last tuesday"
    bad[2]["meta"]["published"] = 20250120
    with pytest.raises(InputError) as err:
        rerank(QUERY, bad, meta_field="published", meta_value_type="date")
    by_id = {v.id: v for v in err.value.violations}
    assert set(by_id) == {"old", "new"}
    assert by_id["old"].path == "chunks[0].meta.published" and "not a valid date" in by_id["old"].message
    with pytest.raises(InputError) as err:
        rerank(QUERY, [{"id": "a", "text": "t", "meta": {"n": "2.5"}}, {"id": "b", "text": "t",
                                                                   "meta": {"n": True}}],
               meta_field="n", meta_value_type="int")
    assert [v.id for v in err.value.violations] == ["a", "b"]
    with pytest.raises(InputError) as err:
        rerank(QUERY, CHUNKS, meta_field="", meta_weight=2, meta_ranking_mode="rrf", missing_meta="skip",
               meta_sort_order="up", meta_value_type="str")
    assert {v.path for v in err.value.violations} == {"meta_field", "meta_weight", "meta_ranking_mode",
                                                      "missing_meta", "meta_sort_order", "meta_value_type"}


# ------------------------------------------------------------------------------ embed_meta_fields

TITLED = [
    {"id": "t1", "text": "It trades memory for recall by building layered proximity graphs.",
     "meta": {"title": "HNSW indexes explained"}},
    {"id": "t2", "text": "HNSW indexes give high recall at low latency.", "meta": {"title": "Benchmarks"}},
    {"id": "t3", "text": "Risotto needs warm stock and constant stirring.", "meta": {"title": "Cooking"}},
]


def test_a_chunk_matching_only_in_its_title_is_ranked_when_the_field_is_embedded() -> None:
    chunks = copy.deepcopy(TITLED)
    without = rerank("HNSW indexes", chunks, 3)
    assert "t1" not in without.ids
    with_title = rerank("HNSW indexes", chunks, 3, embed_meta_fields=["title"])
    assert "t1" in with_title.ids and "t3" not in with_title.ids
    assert chunks == TITLED  # the caller's records are never changed
    # arerank and a batch request (its own option) agree
    assert asyncio.run(arerank("HNSW indexes", chunks, 3, embed_meta_fields=["title"])).ids == with_title.ids
    (batched,) = asyncio.run(arerank_many([{"query": "HNSW indexes", "chunks": chunks, "top_k": 3,
                                            "embed_meta_fields": ["title"]}]))
    assert batched.ids == with_title.ids


def test_the_llm_prompt_shows_the_embedded_fields_before_the_text() -> None:
    with FakeLLM(handler=auto_ranker()) as srv:
        rerank("HNSW indexes", TITLED, 2, backend="openai", base_url=srv.openai_url, model="m",
               embed_meta_fields=["title", "missing-key"])
    lines = [json.loads(x) for x in extract_chunk_lines(srv.requests[0].prompt)]
    assert lines[0]["text"] == "HNSW indexes explained\n" + TITLED[0]["text"]
    assert lines[2]["text"] == "Cooking\n" + TITLED[2]["text"]


def test_embed_meta_fields_must_be_a_list_of_keys() -> None:
    with pytest.raises(InputError, match=r"for one key write \['title'\]"):
        rerank("q", TITLED, embed_meta_fields="title")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"embed_meta_fields\[1\]"):
        rerank("q", TITLED, embed_meta_fields=["title", 3])  # type: ignore[list-item]


# ------------------------------------------------------------------------------ the other surfaces


def test_cli_flags_batch_records_and_call_tool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "chunks.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CHUNKS), encoding="utf-8")
    args = ["rerank", "-q", QUERY, "-c", str(path), "-k", "4", "--lambda", "1", "--meta-field", "published",
            "--meta-value-type", "date", "--missing-meta", "drop", "--meta-weight", "1",
            "--meta-ranking-mode", "linear_score", "--meta-sort-order", "descending"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in out["ranked"]] == ["new", "mid", "old"]
    assert out["dropped"] == [{"id": "none", "reason": "missing_meta: published"}]
    titled = tmp_path / "titled.jsonl"
    titled.write_text("".join(json.dumps(c) + "\n" for c in TITLED), encoding="utf-8")
    assert main(["rerank", "-q", "HNSW indexes", "-c", str(titled), "--embed-meta-field", "title"]) == 0
    assert "t1" in [r["id"] for r in json.loads(capsys.readouterr().out)["ranked"]]
    assert main(["rerank", "-q", QUERY, "-c", str(path), "--meta-weight", "0.5"]) == 2
    assert "--meta-weight needs --meta-field" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "text": "t", "meta": {"d": "soon"}}) + "\n", encoding="utf-8")
    assert main(["rerank", "-q", "q", "-c", str(bad), "--meta-field", "d", "--meta-value-type", "date"]) == 2
    assert "id 'x'" in capsys.readouterr().err
    # batch: run-wide flags, and a line that sets its own options
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"query": QUERY, "chunks": CHUNKS, "top_k": 4, "lambda": 1}) + "\n"
                     + json.dumps({"query": QUERY, "chunks": CHUNKS, "top_k": 4, "lambda": 1,
                                   "missing_meta": "top"}) + "\n", encoding="utf-8")
    out_file = tmp_path / "out.jsonl"
    assert main(["batch", "-i", str(lines), "-o", str(out_file), "--meta-field", "published",
                 "--meta-value-type", "date", "--no-progress"]) == 0
    recs = [json.loads(x) for x in out_file.read_text().splitlines()]
    assert [[r["id"] for r in rec["result"]["ranked"]] for rec in recs] == [
        ["new", "mid", "old", "none"], ["none", "new", "mid", "old"]]
    # call_tool: the options are tool arguments generated from the card
    tool = call_tool({"query": QUERY, "chunks": CHUNKS, "top_k": 4, "lambda": 1, "meta_field": "published",
                      "meta_value_type": "date", "missing_meta": "drop", "meta_weight": None})
    assert [r["id"] for r in tool["ranked"]] == ["new", "mid", "old"]
    assert tool["dropped"] == [{"id": "none", "reason": "missing_meta: published"}]
    err = call_tool({"query": QUERY, "chunks": CHUNKS, "meta_field": "published", "meta_value_type": "date",
                     "meta_ranking_mode": "best"})
    assert err["error"]["type"] == "invalid_input"
    assert [v["path"] for v in err["error"]["violations"]] == ["meta_ranking_mode"]
    titled_tool = call_tool({"query": "HNSW indexes", "chunks": TITLED, "embed_meta_fields": ["title"]})
    assert "t1" in [r["id"] for r in titled_tool["ranked"]]


def test_option_and_chunk_problems_are_reported_together() -> None:
    with pytest.raises(InputError) as err:
        rerank(QUERY, [{"id": "", "text": "t"}], meta_field="published", meta_weight=5,
               embed_meta_fields="title")  # type: ignore[arg-type]
    assert {v.path for v in err.value.violations} == {"meta_weight", "embed_meta_fields", "chunks[0].id"}


@pytest.mark.parametrize("missing", ["bottom", "drop"])
def test_a_meta_field_no_chunk_has_is_refused_as_a_probable_typo(missing: str) -> None:
    # Regression: meta_field="nope" with missing_meta="drop" silently ranked nothing (every chunk
    # dropped as `missing_meta: nope`).
    chunks = [{"id": "a", "text": "IVF partitions vectors into lists.", "meta": {"date": "2024-01-01"}},
              {"id": "b", "text": "HNSW builds a layered graph."}]
    for call in (lambda: rerank(QUERY, chunks, 2, meta_field="nope", missing_meta=missing),
                 lambda: asyncio.run(arerank(QUERY, chunks, 2, meta_field="nope", missing_meta=missing))):
        with pytest.raises(InputError) as info:
            call()
        [violation] = info.value.violations
        assert violation.path == "meta_field" and "'nope'" in violation.message
        assert "no chunk has" in violation.message and "typo" in violation.message
        assert "date" in violation.message  # the keys that do exist, to spot the typo


def test_a_meta_field_some_chunks_have_keeps_the_per_chunk_rule() -> None:
    chunks = [{"id": "a", "text": "IVF partitions vectors into lists.", "meta": {"date": "2024-01-01"}},
              {"id": "b", "text": "IVF index search probes the nearest lists."}]
    result = rerank(QUERY, chunks, 2, meta_field="date", meta_value_type="date", missing_meta="drop")
    assert [r.id for r in result.ranked] == ["a"]
    assert [d.to_dict() for d in result.dropped] == [{"id": "b", "reason": "missing_meta: date"}]


def test_a_year_or_a_year_and_month_is_a_date_at_the_start_of_that_period() -> None:
    """Regression: "2024" and "2024-05", ISO 8601 dates of reduced precision (publication years),
    were refused as "not a valid date" by `datetime.fromisoformat`."""
    chunks = copy.deepcopy(CHUNKS)
    chunks[0]["meta"]["published"] = "2026"
    chunks[1]["meta"]["published"] = "2025-02"
    newest = rerank(QUERY, chunks, 4, 1.0, meta_field="published", meta_value_type="date")
    assert newest.ids == ["old", "mid", "new", "none"]  # 2026-01-01 > 2025-02-01 > 2025-01-20
    for bad in ("2024-13", "24", "2024-5"):
        chunks[0]["meta"]["published"] = bad
        with pytest.raises(InputError, match="not a valid date"):
            rerank(QUERY, chunks, meta_field="published", meta_value_type="date")


# What Python 3.10's `datetime.fromisoformat` reads (its documented grammar): the form every date
# must be in before it is parsed, so a value ranks the same on 3.10 as on 3.11+.
_PY310_ISO = re.compile(r"\A\d{4}-\d{2}-\d{2}(?:[T ]\d{2}(?::\d{2}(?::\d{2}(?:\.\d{3}|\.\d{6})?)?)?"
                        r"(?:[+-]\d{2}:\d{2}(?::\d{2}(?:\.\d{6})?)?)?)?\Z")


@pytest.mark.parametrize(("value", "same_as"), [
    ("2024-03-01T10:00:00+0000", "2024-03-01T10:00:00+00:00"),  # strftime's %z
    ("2024-03-01T10:00:00.5Z", "2024-03-01T10:00:00.500Z"),
    ("2024-03-01T10:00:00,25+01:00", "2024-03-01T10:00:00.250+01:00"),
    ("2024-03-01T10:00:00.1234567-0530", "2024-03-01T10:00:00.123456-05:30"),
    ("2024-03-01T10:00+01", "2024-03-01T10:00+01:00"),
    ("20240301", "2024-03-01"),
    ("20240301T10:00:00Z", "2024-03-01T10:00:00Z"),
])
def test_iso_8601_dates_python_3_10_refuses_are_read_as_on_3_11(value: str, same_as: str) -> None:
    """Regression: on Python 3.10 (requires-python >= 3.10) these ISO 8601 dates were "not a valid
    date" (exit 2) while 3.11 ranked them; they are rewritten to the extended form 3.10 reads."""
    assert _PY310_ISO.match(_extended_iso(value.replace("Z", "+00:00")))
    assert _parse_date(value) == _parse_date(same_as)


def test_the_rewrite_leaves_a_bad_date_bad() -> None:
    for bad in ("2024-13-01", "2024-03-01T25:00", "20241301", "2024-03-01T10:00:00+2"):
        with pytest.raises(ValueError):
            _parse_date(bad)
