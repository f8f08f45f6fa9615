"""The dropped-reason grammar (rag_rerank/reasons.py): one grammar for every writer, every token
documented, and the guard refusing a listed token written another way (issue 15)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank import reasons, rerank
from rag_rerank.backends.local import LocalBackend
from rag_rerank.guard import check_output, validate_request
from rag_rerank.guard.output import judge
from rag_rerank.render import render
from tests.support.fake_llm import FakeLLM, Reply

ROOT = Path(__file__).resolve().parent.parent
QUERY = "When should I prefer IVF over HNSW for vector search?"


def _grammatical(reason: str) -> bool:
    return reasons.split(reason) is not None


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("below_min_score", ("below_min_score", None)),
        ("below_min_score: 0.102", ("below_min_score", "0.102")),
        ("redundant_with:c4", ("redundant_with", "c4")),
        ("redundant_with:  padded  ", ("redundant_with", "  padded  ")),
        ("dropped_by_model: about risotto: not indexes", ("dropped_by_model", "about risotto: not indexes")),
        ("below_min_score (0.102)", None),
        ("not_selected:0.4", None),
        ("not_selected: ", None),
        ("redundant_with:", None),
        ("off_topic: cats", None),
        ("not relevant", None),
    ],
)
def test_split(text: str, parsed: tuple[str, str | None] | None) -> None:
    assert reasons.split(text) == parsed


# The grammar as a regular expression, as `split` read it before it took a partition: the reference
# its fast reading is held to.
_SHAPE = re.compile(r"\A([a-z][a-z0-9_]*)(?::(.*))?\Z", re.DOTALL)


def _split_by_regex(text: str) -> tuple[str, str | None] | None:
    found = _SHAPE.match(text)
    if found is None or found.group(1) not in reasons.TOKENS:
        return None
    token, rest = found.group(1), found.group(2)
    if rest is None:
        return token, None
    if token == reasons.REDUNDANT_WITH:
        return (token, rest) if rest else None
    if not rest.startswith(" ") or not rest.strip():
        return None
    return token, rest[1:]


_REASONS = st.one_of(
    st.text(),
    st.builds(lambda t, sep, rest: t + sep + rest, st.sampled_from([*reasons.TOKENS, "not_selecte", "x"]),
              st.sampled_from(["", ":", ": ", ":  ", " :", "\n:", ":\n", "::", " (", "_x:"]), st.text()),
)


@settings(max_examples=600, derandomize=True, deadline=None)
@given(_REASONS)
@example("not_selected: 0.410")
@example("redundant_with:")
@example("redundant_with: c1")
@example("below_min_score\n")
@example("below_min_score:\n0.1")
@example("not_selected: \u2003")
@example("dropped_by_model: a: b")
@example("no_citable_phrase")
@example("no_citable_phrase: x")
@example("no_citable_phrasee: x")
@example("outside top_k")
def test_split_reads_the_grammar_as_the_regular_expression_does(text: str) -> None:
    """`split` takes a partition at the first colon and looks the head up, not a regular
    expression: it must answer exactly as the expression did, for any text."""
    assert reasons.split(text) == _split_by_regex(text)
    head = re.match(r"[a-z][a-z0-9_]*", text)
    uses_token = head is not None and head.group(0) in reasons.TOKENS
    assert (reasons.problem(text) is not None) == (uses_token and _split_by_regex(text) is None)
    expected = text[len("redundant_with:"):] if text.startswith("redundant_with:") else None
    assert reasons.redundant_target(text) == expected


def test_reason_writes_the_grammar() -> None:
    assert reasons.reason("below_min_score", "0.102") == "below_min_score: 0.102"
    assert reasons.reason("redundant_with", "c4") == "redundant_with:c4"
    assert reasons.reason("over_word_budget") == "over_word_budget"
    with pytest.raises(ValueError):
        reasons.reason("off_topic")


def test_the_local_backends_own_answer_follows_the_grammar(happy_jsonl: str) -> None:
    """It wrote `below_min_score (0.102)` and `not_selected (0.345)`."""
    request = validate_request(QUERY, happy_jsonl, 1, 0.7)
    answer = json.loads(LocalBackend().complete(render(request), request, max_tokens=2048).text)
    found = {d["reason"].split(":")[0] for d in answer["dropped"]}
    assert found >= {"below_min_score", "not_selected"}
    assert all(_grammatical(d["reason"]) for d in answer["dropped"]), answer["dropped"]
    assert any(re.fullmatch(r"below_min_score: \d\.\d{3}", d["reason"]) for d in answer["dropped"])


def test_every_final_reason_of_the_local_path_follows_the_grammar(happy_jsonl: str) -> None:
    for top_k in (1, 2, 5):
        result = rerank(QUERY, happy_jsonl, top_k)
        assert result.dropped and all(_grammatical(d.reason) for d in result.dropped), result.dropped


def test_the_llm_path_files_free_text_under_dropped_by_model(happy_jsonl: str) -> None:
    answer = {
        "ranked": [{"id": "c3", "score": 0.9, "reason": "IVF is preferred when memory is constrained"},
                   {"id": "c1", "score": 0.6, "reason": "HNSW is RAM-heavy"}],
        "dropped": [{"id": "c4", "reason": "FAISS  library\nmention only"},
                    {"id": "c5", "reason": "below_min_score: 0.05"}],
    }
    with FakeLLM([Reply.openai_text(json.dumps(answer))]) as srv:
        result = rerank(QUERY, happy_jsonl, 1, backend="openai", base_url=srv.openai_url, api_key="k")
    got = {d.id: d.reason for d in result.dropped}
    assert got["c4"] == "dropped_by_model: FAISS library mention only"
    assert got["c5"] == "below_min_score: 0.05"  # already in the grammar: kept as the model wrote it
    assert all(_grammatical(r) for r in got.values()), got


def test_the_output_guard_rejects_a_listed_token_written_another_way(happy_jsonl: str) -> None:
    from rag_rerank.guard import parse_chunks

    chunks = parse_chunks(happy_jsonl)
    ranked = [{"id": "c3", "score": 0.9, "reason": "IVF is preferred when memory is constrained"}]
    for bad in ("below_min_score (0.102)", "not_selected:0.4"):
        raw = json.dumps({"ranked": ranked, "dropped": [{"id": "c5", "reason": bad}]})
        found = [str(v) for v in judge(raw, chunks, 3)[1]]
        assert found == [f"$.dropped[0].reason: id 'c5': reason {bad!r} uses the token "
                         f"{bad.split(' ')[0].split(':')[0]!r} but not the grammar "
                         f"'{bad.split(' ')[0].split(':')[0]}' or "
                         f"'{bad.split(' ')[0].split(':')[0]}: detail'"]
    for fine in ("below_min_score: 0.102", "not relevant to the query", "below_min_score"):
        raw = json.dumps({"ranked": ranked, "dropped": [{"id": "c5", "reason": fine}]})
        assert check_output(raw, chunks, 3)["dropped"][0]["reason"] == fine


def test_every_token_is_documented_and_every_documented_token_exists() -> None:
    page = (ROOT / "docs" / "dropped-reasons.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", page, flags=re.MULTILINE))
    assert documented == set(reasons.TOKENS)


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of `path`'s code (docstrings left out: they may show a reason)."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def test_the_grammar_of_a_reason_is_spelt_in_reasons_py_only() -> None:
    """`redundant_with:` was spelt in windows.py, postpass.py and guard/output.py: each now asks
    `reasons.redundant_with` / `reasons.redundant_target`, so the grammar has one owner."""
    spelt = [f"{path.relative_to(ROOT)}:{line}" for path in sorted((ROOT / "rag_rerank").rglob("*.py"))
             if path.name != "reasons.py" for line, text in _code_strings(path)
             if any(text.startswith(f"{token}:") or text == f"{token}:" for token in reasons.TOKENS)]
    assert not spelt, spelt
    assert reasons.redundant_with("c1") == "redundant_with:c1" == reasons.reason(reasons.REDUNDANT_WITH, "c1")
    assert reasons.redundant_target("redundant_with:c1") == "c1"
    assert reasons.redundant_target("not_selected: 0.400") is None
