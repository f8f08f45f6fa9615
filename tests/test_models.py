"""Value types (rag_rerank/models.py): immutable, and the result serialises to exactly the card's schema."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rag_rerank.guard import load_schema
from rag_rerank.models import Chunk, Dropped, Ranked, RerankResult, RunMeta


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
