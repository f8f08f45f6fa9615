"""Value types (rag_rerank/models.py): immutable, and the result serialises to exactly the card's schema."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_rerank.errors import Attempt
from rag_rerank.guard import load_schema
from rag_rerank.models import STATUSES, CallRecord, Chunk, Dropped, Ranked, RerankResult, RunMeta


def test_result_serialises_to_the_output_schema_without_meta() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    result = RerankResult(
        ranked=(Ranked("ñ 1", 0.9, "cites ñ", "diverse"), Ranked("b", 0.5, "b reason")),
        dropped=(Dropped("c", "redundant_with:ñ 1"),),
        meta=RunMeta(backend="openai", attempts=2),
    )
    obj = result.to_dict()
    jsonschema.validate(obj, load_schema("output"))
    assert obj == {
        "ranked": [
            {"id": "ñ 1", "score": 0.9, "reason": "cites ñ", "diversity_note": "diverse"},
            {"id": "b", "score": 0.5, "reason": "b reason"},
        ],
        "dropped": [{"id": "c", "reason": "redundant_with:ñ 1"}],
    }
    assert json.loads(result.to_json()) == obj and "ñ" in result.to_json()
    assert result.ids == ["ñ 1", "b"]


def test_prompt_record_omits_the_embedding() -> None:
    c = Chunk("a", "t", score=1.0, meta={"k": 1}, embedding=(0.1,))
    assert c.prompt_record() == {"id": "a", "text": "t", "score": 1.0, "meta": {"k": 1}}
    assert Chunk("a", "t").prompt_record() == {"id": "a", "text": "t"}


def test_values_are_frozen() -> None:
    for value in (Chunk("a", "t"), Ranked("a", 0.5, "r"), Dropped("a", "r"), RunMeta(), RerankResult(())):
        field = dataclasses.fields(value)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, None)


def test_run_meta_to_dict() -> None:
    d = RunMeta(backend="local", latency_ms=1.23456, repairs=("x",)).to_dict()
    assert d["latency_ms"] == 1.235 and d["repairs"] == ["x"] and d["backend"] == "local"


# --- meta.status and the fallback facts, derived from the engine's record --------------------------


OK = Attempt(1, "ok", "valid answer")
BAD = Attempt(1, "invalid_output", "1 violation")
DENIED = Attempt(1, "fatal", "HTTP 401", error_type="401")


def _meta(*records: CallRecord, **kw: object) -> RunMeta:
    return RunMeta(backend="openai", records=records, **kw)  # type: ignore[arg-type]


def test_status_of_each_path() -> None:
    assert _meta(CallRecord("call", 1, "openai", attempts=(OK,))).status == "ok"
    assert _meta(CallRecord("call", 1, "openai", attempts=(OK,), repairs=("removed a fence",)),
                 repairs=("removed a fence",)).status == "repaired"
    reasked = _meta(CallRecord("call", 1, "openai", attempts=(BAD, Attempt(2, "ok", "valid"))))
    assert reasked.status == "reasked" and reasked.reasks == 1
    # a refused answer with no attempt after it was not a re-ask
    assert CallRecord("call", 1, "openai", ok=False, attempts=(BAD,)).reasks == 0
    fell = _meta(CallRecord("call", 1, "openai", ok=False, attempts=(DENIED,)),
                 CallRecord("call", 1, "local", role="fallback", attempts=(OK,)), fallback="local")
    assert fell.status == "fallback"
    assert fell.fallback_reason == "openai failed (fatal: 401)"
    assert fell.fallback_steps == ({"stage": "call", "index": 1, "steps": [
        {"scorer": "openai", "ok": False, "error": "fatal: 401"}, {"scorer": "local", "ok": True}]},)
    assert set(STATUSES) == {"ok", "repaired", "reasked", "fallback", "partial"}


def test_one_failed_window_is_partial() -> None:
    meta = _meta(CallRecord("window", 1, "openai", attempts=(OK,)),
                 CallRecord("window", 2, "openai", ok=False, attempts=(DENIED,)),
                 CallRecord("window", 2, "cross-encoder", role="fallback", ok=False,
                            error_type="MissingDependencyError"),
                 CallRecord("window", 2, "input", role="fallback", attempts=(OK,)),
                 CallRecord("final", 3, "openai", attempts=(OK,)), fallback="input")
    assert meta.status == "partial"
    assert meta.fallback_reason == "openai failed in 1 of 3 calls (fatal: 401)"
    (entry,) = meta.fallback_steps
    assert [s["scorer"] for s in entry["steps"]] == ["openai", "cross-encoder", "input"]
    assert entry["steps"][1] == {"scorer": "cross-encoder", "ok": False,
                                 "error": "failed: MissingDependencyError"}
    d = meta.to_dict()
    assert d["status"] == "partial" and d["fallback_steps"][0]["index"] == 2


def test_a_meta_without_records_says_what_its_fields_say() -> None:
    assert RunMeta(fallback="local").status == "fallback"
    assert RunMeta(fallback="local", windows=({"fallback": "local"}, {"fallback": None})).status == "partial"
    assert RunMeta(embedder_fallback="lexical").status == "fallback"
    assert RunMeta(embedder_fallback="lexical").fallback_reason == "the embedder failed: lexical vectors used"
    assert RunMeta(repairs=("x",)).status == "repaired"


def test_to_cohere_reports_indices_scores_and_billed_units() -> None:
    record_hit = CallRecord("window", 1, "openai", cached=True,
                            usage={"prompt_tokens": 100, "completion_tokens": 10})
    record_new = CallRecord("window", 2, "openai", attempts=(OK,),
                            usage={"prompt_tokens": 50, "completion_tokens": 5})
    meta = RunMeta(backend="openai", usage={"prompt_tokens": 150, "completion_tokens": 15},
                   records=(record_hit, record_new))
    result = RerankResult(ranked=(Ranked("b", 0.9, "r"), Ranked("a", 0.5, "r")), dropped=(Dropped("c", "x"),),
                          meta=meta, scores={"a": 0.5, "b": 0.9, "c": 0.1})
    out = result.to_cohere(request_id="q1")
    assert out["id"] == "q1"
    assert out["results"] == [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.5}]
    assert out["meta"]["billed_units"] == {"search_units": 1, "input_tokens": 50, "output_tokens": 5}
    assert out["meta"]["tokens"] == {"input_tokens": 150, "output_tokens": 15}
    assert out["meta"]["status"] == "ok" and "fallback_reason" not in out["meta"]
    assert result.to_cohere(top_n=1)["results"] == [{"index": 1, "relevance_score": 0.9}]
    many = RerankResult(ranked=(), scores={f"c{i}": 0.1 for i in range(250)})
    assert many.to_cohere()["meta"]["billed_units"]["search_units"] == 3


def test_ranked_and_dropped_hand_written_init_does_what_the_generated_one_did() -> None:
    """Ranked and Dropped set their fields straight into the instance dict (issue 37: one of each
    per chunk of every call): the same signature, values, defaults, equality, hash, frozenness,
    replace/asdict/pickle as a frozen dataclass generating its own __init__."""
    import dataclasses
    import inspect
    import pickle

    for cls, args in ((Ranked, ("c1", 0.5, "cites x", "moved")), (Dropped, ("c2", "not_selected: 0.410"))):
        spec = [(f.name, f.type, f) for f in dataclasses.fields(cls)]
        twin = dataclasses.make_dataclass(cls.__name__, spec, frozen=True)
        assert str(inspect.signature(cls)).replace("'", "") == str(inspect.signature(twin)).replace("'", "")
        names = [f.name for f in dataclasses.fields(cls)]
        made, keyed = cls(*args), cls(**dict(zip(names, args, strict=True)))
        assert made == keyed and hash(made) == hash(keyed)
        assert vars(made) == vars(twin(*args)) and dataclasses.asdict(made) == dataclasses.asdict(twin(*args))
        assert pickle.loads(pickle.dumps(made)) == made and dataclasses.replace(made, id="z").id == "z"
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.id = "other"  # type: ignore[misc]
    assert Ranked("c1", 0.5, "r") == Ranked(id="c1", score=0.5, reason="r", diversity_note=None)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(min_value=1, max_value=50), st.booleans(), st.booleans())
def test_with_top_k_is_what_dataclasses_replace_makes(top_k: int, own: bool, ranked: bool) -> None:
    """`RerankRequest.with_top_k` (every call's ask, `windows.asked`) copies the fields itself."""
    from rag_rerank.models import RerankRequest

    chunks = (Chunk("a", "x"), Chunk("b", "y", 0.5))
    request = RerankRequest("q", chunks, 3, 0.7, (4, 9) if ranked else None, {"a": "x0"} if own else None,
                            0.1)
    got, expected = request.with_top_k(top_k), dataclasses.replace(request, top_k=top_k)
    assert got == expected and type(got) is type(expected) and list(vars(got)) == list(vars(expected))
    assert all(vars(got)[k] is vars(expected)[k] for k in vars(got)) and request.top_k == 3
