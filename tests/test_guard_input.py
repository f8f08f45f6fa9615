"""The input guard (rag_rerank/guard/input.py): every rule with both verdicts, and properties."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rag_rerank.errors import InputError
from rag_rerank.guard import load_limits, parse_chunks, validate_request
from rag_rerank.guard.input import NO_CONTEXT_BUDGET
from rag_rerank.models import Chunk, RerankRequest
from rag_rerank.shortening import prompt_tokens, shorten


def jl(*records: object) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def messages(exc: pytest.ExceptionInfo[InputError]) -> list[str]:
    return [str(v) for v in exc.value.violations]


def reject(
    query: object = "q", chunks: object = None, top_k: object = None, lambda_: object = None, **kw: object
) -> list[str]:
    with pytest.raises(InputError) as exc:
        validate_request(
            query, chunks if chunks is not None else jl({"id": "a", "text": "t"}), top_k, lambda_, **kw
        )
    return messages(exc)


OK = jl({"id": "a", "text": "alpha"}, {"id": "b", "text": "beta"})


def test_happy_path_card_example(happy_jsonl: str) -> None:
    req = validate_request("q", happy_jsonl, 3, 0.7)
    assert isinstance(req, RerankRequest)
    assert req.ids == ("c1", "c2", "c3", "c4", "c5")
    assert (req.top_k, req.lambda_) == (3, 0.7)


def test_defaults_come_from_limits() -> None:
    req = validate_request("q", OK)
    lim = load_limits()
    assert (req.top_k, req.lambda_) == (lim.default_top_k, lim.default_lambda) == (5, 0.7)


# --- lines and records ---------------------------------------------------------------------------


def test_line_that_is_not_json_names_the_line() -> None:
    out = reject(chunks='{"id": "a", "text": "t"}\n{"id": "b", "text": \n')
    assert len(out) == 1 and out[0].startswith("line 2: chunks[1]: not valid JSON")


def test_blank_lines_are_ignored() -> None:
    req = validate_request("q", '\n\n{"id": "a", "text": "t"}\n   \n\t\n{"id": "b", "text": "u"}\n\n')
    assert req.ids == ("a", "b")


def test_record_must_be_an_object() -> None:
    out = reject(chunks='[1, 2]\n"text"\n3\nnull\n')
    assert [o.split(": ", 2)[2] for o in out] == [
        "a chunk must be a JSON object, got array",
        "a chunk must be a JSON object, got string",
        "a chunk must be a JSON object, got number",
        "a chunk must be a JSON object, got null",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (json.dumps([{"id": "a", "text": "t"}, {"id": "b", "text": "u"}], indent=2),
         "one JSON array of 2 items as text spread over 10 lines, not JSONL"),
        (json.dumps([{"id": "a", "text": "t"}, {"id": "b", "text": "u"}]),
         "one JSON array of 2 items as text, not JSONL"),
        (json.dumps({"id": "a", "text": "t"}, indent=1), "one JSON object spread over 4 lines, not JSONL"),
    ],
)
def test_a_json_array_or_pretty_printed_object_is_named_as_such(text: str, expected: str) -> None:
    """A `chunks.json` array (the form most tools write) is one clear violation, not one "not valid
    JSON" line per line of the file nor "a chunk must be a JSON object, got array"."""
    out = reject(chunks=text + "\n")
    assert len(out) == 1, out
    assert expected in out[0] and out[0].startswith("line 1: chunks: ")


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"text": "t"}, "chunks[0].id: missing required field 'id'"),
        ({"id": 1, "text": "t"}, "field 'id' must be a string, got number"),
        ({"id": None, "text": "t"}, "field 'id' must be a string, got null"),
        ({"id": ["a"], "text": "t"}, "field 'id' must be a string, got array"),
        ({"id": "", "text": "t"}, "field 'id' must not be empty"),
        ({"id": "a"}, "missing required field 'text'"),
        ({"id": "a", "text": 5}, "field 'text' must be a string, got number"),
        ({"id": "a", "text": {"x": 1}}, "field 'text' must be a string, got object"),
        ({"id": "a", "text": "t", "score": "0.5"}, "field 'score' must be a number, got string"),
        ({"id": "a", "text": "t", "score": True}, "field 'score' must be a number, got boolean"),
        ({"id": "a", "text": "t", "meta": [1]}, "field 'meta' must be an object, got array"),
        ({"id": "a", "text": "t", "embedding": []}, "field 'embedding' must not be an empty array"),
        ({"id": "a", "text": "t", "embedding": [1, "x"]}, "must be a number, got string"),
    ],
)
def test_bad_record_fields(record: dict[str, object], expected: str) -> None:
    out = reject(chunks=jl(record))
    assert any(expected in o for o in out), out
    assert all(o.startswith("line 1: chunks[0]") for o in out), out


@pytest.mark.parametrize(
    "record",
    [
        {"id": "a", "text": ""},
        {"id": " ", "text": "whitespace id is still an id"},
        {"id": "a", "text": "t", "score": -3},
        {"id": "a", "text": "t", "score": 0.5, "meta": {"k": [1, {"n": None}]}, "embedding": [1, 0.5]},
        {"id": "a", "text": "t", "unknown_field": "ignored, not an error"},
    ],
)
def test_good_record_fields(record: dict[str, object]) -> None:
    (chunk,) = validate_request("q", jl(record)).chunks
    assert chunk.id == record["id"] and chunk.text == record["text"]


def test_optional_fields_are_kept() -> None:
    (c,) = parse_chunks(jl({"id": "a", "text": "t", "score": 2, "meta": {"src": "x"}, "embedding": [1, 2]}))
    assert (c.score, dict(c.meta or {}), c.embedding) == (2.0, {"src": "x"}, (1.0, 2.0))


@pytest.mark.parametrize(
    "bad",
    [
        '{"id": "a", "text": "t", "score": NaN}',
        '{"id": "a", "text": "t", "score": Infinity}',
        '{"id": "a", "text": "t", "score": -Infinity}',
    ],
)
def test_non_finite_json_constants_are_rejected(bad: str) -> None:
    out = reject(chunks=bad)
    assert out[0].startswith("line 1: chunks[0]: not valid JSON") and "not a finite number" in out[0]


def test_non_finite_numbers_from_python_records() -> None:
    out = reject(
        chunks=[
            {"id": "a", "text": "t", "score": math.nan},
            {"id": "b", "text": "t", "embedding": [1.0, math.inf]},
            {"id": "c", "text": "t", "score": 10**400},
        ]
    )
    assert out == [
        "chunks[0].score: id 'a': score must be a finite number",
        "chunks[1].embedding: id 'b': embedding holds NaN, Infinity or a number too large for a float",
        "chunks[2].score: id 'c': score must be a finite number",
    ]


def test_huge_integer_literal_in_jsonl_is_an_error_not_a_crash() -> None:
    out = reject(chunks='{"id": "a", "text": "t", "score": 1' + "0" * 400 + "}")
    assert out == ["line 1: chunks[0].score: id 'a': score must be a finite number"]


def test_meta_that_json_cannot_carry() -> None:
    out = reject(
        chunks=[
            {"id": "a", "text": "t", "meta": {"s": {1, 2}}},
            {"id": "b", "text": "t", "meta": {"x": math.nan}},
        ]
    )
    assert out[0].startswith("chunks[0].meta: id 'a': meta is not plain JSON")
    assert out[1].startswith("chunks[1].meta: id 'b': meta is not plain JSON")


def test_embedding_dimensions_must_agree() -> None:
    out = reject(
        chunks=jl({"id": "a", "text": "t", "embedding": [1, 2]}, {"id": "b", "text": "t", "embedding": [1]})
    )
    assert out == ["chunks[*].embedding: embeddings have different dimensions: [1, 2]"]
    assert (
        len(
            validate_request(
                "q", jl({"id": "a", "text": "t", "embedding": [1, 2]}, {"id": "b", "text": "t"})
            ).chunks
        )
        == 2
    )


def test_lone_surrogates_are_rejected_naming_line_field_and_id() -> None:
    out = reject(
        chunks='{"id": "ok", "text": "t"}\n{"id": "x\\ud800", "text": "t"}\n{"id": "y", "text": "\\udfff"}\n'
        '{"id": "z", "text": "t", "meta": {"k": "\\ud83d"}}\n'
    )
    assert out[0].startswith("line 2: chunks[1].id: id 'x\\\\ud800': id holds a lone surrogate at index 1")
    assert out[1].startswith("line 3: chunks[2].text: id 'y': text holds a lone surrogate at index 0")
    assert out[2].startswith("line 4: chunks[3].meta: id 'z': meta holds a lone surrogate")
    # a proper pair written as two escapes is one astral character, not a surrogate
    assert validate_request("q", '{"id": "\\ud83d\\ude00", "text": "t"}').ids == ("😀",)


def test_lone_surrogate_in_query() -> None:
    assert reject(query="what \udcff") == [
        "query: query holds a lone surrogate at index 5 (not valid Unicode; it cannot be sent as UTF-8)"
    ]


# --- the collection ------------------------------------------------------------------------------


def test_duplicate_ids_are_named_with_their_lines() -> None:
    out = reject(
        chunks=jl(
            {"id": "a", "text": "1"},
            {"id": "b", "text": "2"},
            {"id": "a", "text": "3"},
            {"id": "b", "text": "4"},
            {"id": "A", "text": "5"},
        )
    )
    assert out == ["chunks: duplicate ids (ids must be unique): 'a' at line 1, line 3; 'b' at line 2, line 4"]


def test_duplicate_ids_in_a_list_are_named_by_index() -> None:
    out = reject(chunks=[{"id": "x", "text": "1"}, {"id": "x", "text": "2"}])
    assert out == ["chunks: duplicate ids (ids must be unique): 'x' at chunks[0], chunks[1]"]


def test_ids_differing_in_case_or_normalisation_are_distinct() -> None:
    req = validate_request(
        "q",
        [
            {"id": "a", "text": "1"},
            {"id": "A", "text": "2"},
            {"id": "caf\u00e9", "text": "3"},
            {"id": "cafe\u0301", "text": "4"},
        ],
    )
    assert req.ids == ("a", "A", "caf\u00e9", "cafe\u0301")


def test_fifty_chunks_pass_fifty_one_fail() -> None:
    assert len(validate_request("q", [{"id": str(i), "text": "t"} for i in range(50)]).chunks) == 50
    out = reject(chunks=[{"id": str(i), "text": "t"} for i in range(51)])
    assert out == ["chunks: 51 chunks is over the limit of 50 (max_chunks); pass window_size (CLI "
                   "--window-size N, e.g. 20; at most 50) to rank up to 1000 in windows, or split the set "
                   "or pre-filter it"]


def test_no_context_budget_counts_no_tokens() -> None:
    """A request whose long chunks may be shortened is guarded with `NO_CONTEXT_BUDGET` (the
    shortening counts against the real budget): its texts are not counted at all. One token less
    is a budget again, counted and enforced by the same tokenizer."""
    asked: list[str] = []

    def words(text: str) -> int:
        asked.append(text)
        return NO_CONTEXT_BUDGET  # a count that would be over any budget below it

    chunks = [{"id": "a", "text": "one two"}, {"id": "b", "text": "three"}]
    none = load_limits().with_overrides(max_context_tokens=NO_CONTEXT_BUDGET)
    assert validate_request("qq", chunks, limits=none, tokenizer=words).ids == ("a", "b")
    assert asked == []
    some = load_limits().with_overrides(max_context_tokens=NO_CONTEXT_BUDGET - 1)
    assert reject(query="qq", chunks=chunks, limits=some, tokenizer=words)
    assert asked


def test_token_budget_is_configurable_and_inclusive() -> None:
    """Counted by the caller's tokenizer when given (here: one token per word), else by the package's
    estimate; a prompt of exactly the budget passes."""
    lim = load_limits().with_overrides(max_context_tokens=10)
    words = {"tokenizer": lambda text: len(text.split())}
    # query 1 + id 1 + text 8 = 10 tokens
    assert validate_request("qq", [{"id": "a", "text": "w " * 8}], limits=lim, **words)
    out = reject(query="qq", chunks=[{"id": "a", "text": "w " * 9}], limits=lim, **words)
    assert out == [
        "chunks: about 11 tokens of text is over the budget of 10 (max_context_tokens); the longest: id 'a' "
        "(chunks[0]) about 10 tokens; send fewer or shorter chunks or raise the budget"
    ]
    text = "Budgets are counted by the one estimator, not by characters / 4. " * 3
    need = prompt_tokens("qq", [Chunk("a", text)])
    assert need != -(-(len(text) + 3) // 4)  # a different count than the old characters / 4
    assert validate_request("qq", [{"id": "a", "text": text}], limits={"max_context_tokens": need})
    assert reject(query="qq", chunks=[{"id": "a", "text": text}], limits={"max_context_tokens": need - 1})
    assert reject(chunks=[{"id": "a", "text": "t"}], tokenizer=42) == [
        "tokenizer: tokenizer must be None, a callable text -> token count, or an object with encode(text) "
        "(a Hugging Face or tiktoken tokenizer)"
    ]


def test_the_budget_counts_the_id_and_meta_the_prompt_shows() -> None:
    """A chunk's id and meta are rendered into the prompt beside its text: a 5 MB meta or id with a
    one-word text used to pass the budget and go to the LLM in full on every call."""
    huge_meta = {"id": "a", "text": "t", "meta": {"blob": "x" * 200_000}}
    huge_id = {"id": "a" * 200_000, "text": "t"}
    for chunk in (huge_meta, huge_id):
        (problem,) = reject(chunks=[chunk])
        assert "over the budget of 32000 (max_context_tokens)" in problem and "about 400" in problem
        assert len(problem) < 300  # a huge id is shortened when the error names it
    lim = load_limits().with_overrides(max_context_tokens=40)
    chars = {"tokenizer": len}  # one token per character, to count exactly what is counted
    # query 1 + id 1 + text 1 + '{"k": "' 7 + 28 + '"}' 2 = 40 characters
    assert validate_request("q", [{"id": "a", "text": "t", "meta": {"k": "v" * 28}}], limits=lim, **chars)
    assert reject(query="q", chunks=[{"id": "a", "text": "t", "meta": {"k": "v" * 29}}], limits=lim, **chars)


def test_an_over_budget_error_names_the_chunks_to_shorten() -> None:
    """One huge document among short ones: the error names it (id, line, size), not only the total;
    in windows too. Chunks that are each a small part of the budget are not listed."""
    chunks = jl(*({"id": f"c{i}", "text": "x" * (200_000 if i == 33 else 100)} for i in range(40)))
    out = reject(chunks=chunks)
    big = prompt_tokens("", [Chunk("c33", "x" * 200_000)])
    assert len(out) == 1 and f"the longest: id 'c33' (line 34) about {big} tokens;" in out[0], out
    out = reject(chunks=chunks, window_size=20)
    assert len(out) == 1 and "chunks[20:40] about" in out[0] and "the longest: id 'c33' (line 34)" in out[0]
    many = reject(chunks=[{"id": f"c{i}", "text": "x" * 4000} for i in range(50)])
    assert len(many) == 1 and "longest" not in many[0]


def test_no_chunks_is_an_error() -> None:
    for empty in ("", "\n \n", [], b""):
        assert reject(chunks=empty) == ['chunks: no chunks: give at least one {"id", "text"} record']


# --- parameters ----------------------------------------------------------------------------------


@pytest.mark.parametrize("top_k", [0, -1, 0.0, "3", True, None.__class__, 1.5, float("inf"), float("nan")])
def test_bad_top_k(top_k: object) -> None:
    out = reject(top_k=top_k)
    assert len(out) == 1 and out[0].startswith("top_k: top_k must be a positive integer, got ")


@pytest.mark.parametrize("top_k", [1, 5, 50, 10**6])
def test_good_top_k(top_k: int) -> None:
    assert validate_request("q", OK, top_k).top_k == top_k


def test_integral_float_top_k_is_an_integer_as_in_json_schema() -> None:
    # The tool schema says "integer", which JSON Schema (and so the calling model) satisfies with 3.0.
    req = validate_request("q", OK, 3.0)
    assert req.top_k == 3 and type(req.top_k) is int


def test_numpy_scalars_are_accepted() -> None:
    np = pytest.importorskip("numpy")
    req = validate_request("q", OK, np.int64(2), np.float32(0.5))
    assert (req.top_k, req.lambda_) == (2, 0.5) and type(req.top_k) is int and type(req.lambda_) is float


@pytest.mark.parametrize("lam", [-0.01, 1.01, math.nan, math.inf, "0.5", True, 10**400, [0.5]])
def test_bad_lambda(lam: object) -> None:
    out = reject(lambda_=lam)
    assert len(out) == 1 and out[0].startswith("lambda: lambda must be a number in [0, 1], got ")


@pytest.mark.parametrize("lam", [0, 0.0, 0.7, 1, 1.0])
def test_good_lambda(lam: float) -> None:
    assert validate_request("q", OK, None, lam).lambda_ == float(lam)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", "query: query is empty"),
        ("  \n\t", "query: query is empty"),
        (None, "query: query must be a string, got null"),
        (42, "query: query must be a string, got number"),
        ("x" * 4001, "query: query has 4001 characters, over the limit of 4000 (max_query_chars)"),
    ],
)
def test_bad_query(query: object, expected: str) -> None:
    assert reject(query=query) == [expected]


def test_every_problem_is_reported_at_once() -> None:
    out = reject(
        query="",
        top_k=0,
        lambda_=2,
        chunks='not json\n{"id": "a"}\n{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n',
    )
    assert [o.split(":")[0] for o in out] == ["query", "top_k", "lambda", "line 1", "line 2", "chunks"]


# --- sources -------------------------------------------------------------------------------------


def test_sources_str_bytes_path_list_chunks_generator(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(OK, encoding="utf-8")
    records = [{"id": "a", "text": "alpha"}, {"id": "b", "text": "beta"}]
    chunk_objs = [Chunk("a", "alpha"), Chunk("b", "beta", score=1.0, embedding=(1.0, 0.0))]
    for source in (OK, OK.encode(), f, records, chunk_objs, (r for r in records)):
        assert validate_request("q", source).ids == ("a", "b")


def test_bad_sources(tmp_path: Path) -> None:
    assert reject(chunks=b"\xff\xfe{") == [
        "line 1: chunks: not UTF-8 text (byte 0) (it looks like UTF-16; save it as UTF-8)"]
    missing = tmp_path / "nope.jsonl"
    out = reject(chunks=missing)
    assert out[0].startswith(f"{missing}: cannot read chunks file")
    assert reject(chunks={"id": "a", "text": "t"}) == [
        "chunks: chunks must be a list of records, not one object"
    ]
    assert reject(chunks=42) == ["chunks: chunks must be JSONL text, a path or a list, got number"]


def test_a_jsonl_string_is_never_taken_for_a_path(tmp_path: Path) -> None:
    out = reject(chunks=str(tmp_path / "x.jsonl"))
    assert out[0].startswith("line 1: chunks[0]: not valid JSON")


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    out = reject(chunks="[" * 100_000)
    assert out[0].startswith("line 1: chunks[0]: not valid JSON")


def test_only_newline_separates_records() -> None:
    # U+2028, U+0085 and \x1c are legal inside a JSON string; str.splitlines would break them
    req = validate_request("q", '{"id": "a", "text": "x\u2028y\u0085z\\u001cw"}\n')
    assert req.chunks[0].text == "x\u2028y\u0085z\x1cw"


def test_input_is_not_mutated() -> None:
    records = [{"id": "a", "text": "t", "meta": {"k": 1}}]
    before = json.dumps(records)
    validate_request("q", records)
    assert json.dumps(records) == before


# --- properties ----------------------------------------------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
given = hypothesis.given

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4),
    max_leaves=20,
)
records = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"id": json_values, "text": json_values},
        optional={"score": json_values, "meta": json_values, "embedding": json_values},
    ),
    st.fixed_dictionaries(
        {"id": st.text(), "text": st.text()},
        optional={
            "score": st.floats() | st.integers(),
            "meta": st.dictionaries(st.text(), json_values),
            "embedding": st.lists(st.floats() | st.integers(), max_size=3),
        },
    ),
)
anything = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.binary())


def _only_input_error(query: object, chunks: object, top_k: object, lam: object) -> None:
    try:
        req = validate_request(query, chunks, top_k, lam)
    except InputError as exc:
        assert exc.violations
        for v in exc.violations:
            str(v).encode("utf-8")  # every message is printable, even for surrogate-laden input
        return
    # what passes is safe for every later stage: encodable, renderable, finite
    from rag_rerank.render import render

    render(req).encode("utf-8")
    assert 0.0 <= req.lambda_ <= 1.0 and req.top_k >= 1


@given(query=st.text() | anything, chunks=st.text(), top_k=anything, lam=anything)
def test_property_arbitrary_text_only_raises_input_error(
    query: object, chunks: str, top_k: object, lam: object
) -> None:
    _only_input_error(query, chunks, top_k, lam)


@given(chunks=st.binary())
def test_property_arbitrary_bytes_only_raise_input_error(chunks: bytes) -> None:
    _only_input_error("q", chunks, None, None)


@given(chunks=st.lists(records, max_size=6))
def test_property_arbitrary_records_only_raise_input_error(chunks: list[object]) -> None:
    _only_input_error("q", chunks, 3, 0.5)


@given(chunks=st.lists(records, max_size=6))
def test_property_arbitrary_jsonl_only_raises_input_error(chunks: list[object]) -> None:
    text = "\n".join(json.dumps(r) for r in chunks)
    _only_input_error("q", text, 3, 0.5)


def test_tuple_and_numpy_embeddings_from_python_are_accepted_and_not_modified() -> None:
    """Regression: a tuple or numpy vector (what a vector store returns) was refused with
    "field 'embedding' must be an array, got array" / "got ndarray"."""
    np = pytest.importorskip("numpy")
    vectors = [(1.0, 0.0, 0.5), np.array([0.0, 1.0, 0.5]), np.array([0.5, 0.5, 0.5], dtype=np.float32)]
    records = [{"id": f"c{i}", "text": f"text {i}", "embedding": v} for i, v in enumerate(vectors)]
    chunks = parse_chunks(records)
    assert [c.embedding for c in chunks] == [(1.0, 0.0, 0.5), (0.0, 1.0, 0.5), (0.5, 0.5, 0.5)]
    assert records[1]["embedding"] is vectors[1]  # the caller's dict still holds its own array
    chunk_objects = parse_chunks([Chunk(id="a", text="t", embedding=np.array([1.0, 2.0]))])
    assert chunk_objects[0].embedding == (1.0, 2.0)
    with pytest.raises(InputError, match="NaN"):
        parse_chunks([{"id": "a", "text": "t", "embedding": np.array([np.nan, 1.0])}])


def test_a_utf8_bom_before_the_first_record_is_not_part_of_it() -> None:
    chunks = parse_chunks('\ufeff{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n')
    assert [c.id for c in chunks] == ["a", "b"]


def test_a_file_name_passed_as_str_gets_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "chunks.jsonl"
    path.write_text('{"id": "a", "text": "x"}\n', encoding="utf-8")
    with pytest.raises(InputError) as err:
        parse_chunks(str(path))
    assert "a str is JSONL text: to read a file, pass pathlib.Path(...)" in str(err.value)
    assert [c.id for c in parse_chunks(path)] == ["a"]


def test_validate_params_checks_query_and_counts_without_chunks() -> None:
    from rag_rerank.guard.input import validate_params

    validate_params("a question")  # defaults from the limits
    validate_params("a question", 3, 0.5)
    with pytest.raises(InputError) as err:
        validate_params("  ", 0, 2.0)
    assert [v.path for v in err.value.violations] == ["query", "top_k", "lambda"]
    with pytest.raises(InputError) as direct:
        validate_request(None, [{"id": "a", "text": "x"}])
    with pytest.raises(InputError) as alone:
        validate_params(None)
    assert str(alone.value) == str(direct.value)


# --- issue 15 -------------------------------------------------------------------------------------------


def test_the_path_hint_does_not_tell_whether_the_file_exists(tmp_path: Path) -> None:
    """The same answer for an existing and a missing path: no file-existence oracle."""
    real = tmp_path / "chunks.jsonl"
    real.write_text('{"id": "a", "text": "x"}\n', encoding="utf-8")
    answers = []
    for path in (real, tmp_path / "missing.jsonl"):
        with pytest.raises(InputError) as err:
            parse_chunks(str(path))
        answers.append(str(err.value).replace(str(path), "PATH"))
    assert answers[0] == answers[1] and "pathlib.Path" in answers[0]


@pytest.mark.parametrize(
    ("line", "keys"),
    [('{"id": "a", "id": "b", "text": "x"}', "'id'"),
     ('{"id": "a", "text": "x", "meta": {"k": 1, "k": 2}}', "'k'"),
     ('{"id": "a", "text": "x", "text": "y", "id": "c"}', "'text', 'id'")],
)
def test_a_duplicate_key_in_a_line_is_refused_naming_line_and_key(line: str, keys: str) -> None:
    text = '{"id": "z", "text": "fine"}\n' + line + "\n"
    with pytest.raises(InputError) as err:
        parse_chunks(text)
    (v,) = err.value.violations
    assert v.line == 2 and v.path == "chunks[1]"
    assert v.message.startswith(f"duplicate key{'s' if ',' in keys else ''} {keys} in one JSON object")


def test_a_duplicate_key_in_the_only_line_is_named_as_such() -> None:
    """A one-record file whose record writes a key twice is told so, not that it is "one JSON
    object, not JSONL" (it is on one line: that advice would send the user round in circles)."""
    for text in ('{"id": "a", "text": "x", "text": "y"}', '{"id": "a", "text": "x", "text": "y"}\n'):
        with pytest.raises(InputError) as err:
            parse_chunks(text)
        (v,) = err.value.violations
        assert v.line == 1 and v.path == "chunks[0]", v
        assert v.message.startswith("duplicate key 'text' in one JSON object"), v.message


def test_framework_documents_passed_to_rerank_name_the_component() -> None:
    """LangChain / LlamaIndex / Haystack objects given to rerank() itself: besides one violation per
    record, one line names the drop-in component for that framework."""
    lc = pytest.importorskip("langchain_core.documents")
    hs = pytest.importorskip("haystack")
    li = pytest.importorskip("llama_index.core.schema")
    cases = [
        ([lc.Document(id="a", page_content="t"), lc.Document(id="b", page_content="u")],
         "langchain_core Document objects: rerank them with "
         "rag_rerank.integrations.langchain.RagRerankCompressor"),
        ([hs.Document(id="a", content="t")],
         "haystack Document objects: rerank them with rag_rerank.integrations.haystack.RagRerankRanker"),
        ([li.NodeWithScore(node=li.TextNode(id_="a", text="t"))],
         "llama_index NodeWithScore objects: rerank them with "
         "rag_rerank.integrations.llama_index.RagRerankPostprocessor"),
    ]
    for docs, expected in cases:
        out = reject(chunks=docs)
        assert out[:-1] == [f"chunks[{i}]: a chunk must be a JSON object, got {type(d).__name__}"
                            for i, d in enumerate(docs)]
        assert out[-1].startswith(f"chunks: these are {expected}"), out
    assert reject(chunks=["plain text"]) == ["chunks[0]: a chunk must be a JSON object, got string"]


def test_utf16_bytes_are_named_as_utf16(tmp_path: Path) -> None:
    """Windows PowerShell 5 writes UTF-16 with `>`: the error says so instead of only "byte 0"."""
    data = jl({"id": "a", "text": "t"}).encode("utf-16")
    for source in (data, tmp_path / "c.jsonl"):
        (tmp_path / "c.jsonl").write_bytes(data)
        out = reject(chunks=source)
        assert len(out) == 1
        assert out[0].endswith("not UTF-8 text (byte 0) (it looks like UTF-16; save it as UTF-8)")
    assert "UTF-16" not in reject(chunks=b"\x85 latin-1\n")[0]


def test_optional_fields_set_to_none_by_a_python_caller_are_absent() -> None:
    """`dataclasses.asdict(Chunk(...))` (our own value type) and a pydantic `model_dump()` write
    score / meta / embedding as None; rerank() refused them: 'field 'score' must be a number, got
    null' for every chunk. From Python, None now means absent, as it does in `Chunk`. The caller's
    dicts are not modified, and JSONL text keeps the schema's rule."""
    import dataclasses

    records = [dataclasses.asdict(Chunk("a", "IVF partitions vectors")),
               {"id": "b", "text": "HNSW is a graph", "score": 0.4, "meta": None, "embedding": None}]
    before = [dict(r) for r in records]
    chunks = parse_chunks(records)
    assert [(c.id, c.score, c.meta, c.embedding) for c in chunks] == [("a", None, None, None),
                                                                       ("b", 0.4, None, None)]
    assert records == before
    with pytest.raises(InputError, match="field 'score' must be a number, got null"):
        parse_chunks(jl({"id": "a", "text": "t", "score": None}))


def test_an_integer_id_says_to_pass_it_as_a_string() -> None:
    """Qdrant, Milvus and SQL keys are integers; 'must be a string, got number' left the user to
    work out why a number is refused and what to send instead."""
    out = reject(chunks=[{"id": 7, "text": "IVF"}, {"id": 1.5, "text": "HNSW"}])
    assert out[0].endswith("field 'id' must be a string, got number (ids come back byte for byte, so they "
                           'must be strings: str(id), e.g. "7")')
    assert out[1].endswith("field 'id' must be a string, got number")  # not a whole number: no guess
    assert reject(chunks=jl({"id": 7, "text": "IVF"}))[0].endswith('must be strings: write "7")')  # JSONL


def test_a_number_of_thousands_of_digits_is_named_without_pythons_advice() -> None:
    """Python says to raise sys.set_int_max_str_digits(); for a data file that advice is wrong."""
    (problem,) = reject(chunks='{"id": "a", "text": "t", "score": ' + "9" * 5000 + "}")
    assert "a number of more than 4300 digits" in problem and "set_int_max_str_digits" not in problem


# --- a record shaped like a framework's document -------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "hint"),
    [
        ({"id": "a", "page_content": "IVF"},
         "'page_content' (a LangChain Document's text): rename it to 'text'"),
        ({"id": "a", "content": "IVF"}, "'content' (a Haystack Document's text): rename it to 'text'"),
        ({"id": "a", "body": "IVF"}, "'body': rename it to 'text'"),
        ({"id": "a", "txt": "IVF"}, "'txt': rename it to 'text'"),  # a misspelling
        ({"id": "a", "Text": "IVF"}, "'Text': rename it to 'text'"),
        ({"id_": "a", "text": "IVF"}, "'id_' (a LlamaIndex node's id): rename it to 'id'"),
        ({"id": "a", "page_content": "IVF", "metadata": {"source": "s"}},
         "'page_content' (a LangChain Document's text): rename it to 'text' (and 'metadata' to 'meta', "
         "or it is ignored)"),
    ],
)
def test_a_framework_shaped_record_is_told_which_field_to_rename(record: dict[str, object],
                                                                 hint: str) -> None:
    """Regression: `{"id", "page_content"}` (LangChain), `{"id", "content"}` (Haystack) and
    `{"id", "body"}` got a bare "missing required field 'text'"."""
    missing = "id" if "text" in record else "text"
    expected = f"chunks[0].{missing}: " + ("id 'a': " if missing == "text" else "") + (
        f"missing required field '{missing}'; this record has {hint}")
    with pytest.raises(InputError) as exc:  # a list of dicts (Python), one violation
        parse_chunks([record])
    assert messages(exc) == [expected]
    assert reject(chunks=jl(record)) == [f"line 1: {expected}"]  # JSONL text: the line is named too


def test_no_rename_hint_without_a_field_that_could_be_the_text() -> None:
    assert reject(chunks=jl({"id": "a", "title": "IVF"})) == [
        "line 1: chunks[0].text: id 'a': missing required field 'text'"]
    assert validate_request("q", jl({"id": "a", "text": "t", "content": "u"})).ids == ("a",)  # text is there


class _Words:
    """A caller's tokenizer with `encode` (one token per word)."""

    def encode(self, text: str) -> list[str]:
        return text.split()


@hypothesis.settings(derandomize=True, max_examples=300, deadline=None)
@given(
    query=st.text(max_size=60),
    records=st.lists(st.tuples(st.text(min_size=1, max_size=12), st.text(max_size=300),
                               st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.text(max_size=30),
                                                                    max_size=2))),
                     min_size=1, max_size=8, unique_by=lambda r: r[0]),
    budget=st.integers(1, 400),
    window=st.sampled_from([None, 3]),
    tokenizer=st.sampled_from([None, len, _Words()]),
)
@hypothesis.example(query="q", records=[("a", "It\u2019s \u4e2d\u6587 text \U0001f600", None)], budget=12,
                    window=None, tokenizer=None)
@hypothesis.example(query="", records=[("a", "x" * 300, {"k": "v"})], budget=80, window=None, tokenizer=None)
def test_the_guard_and_the_shortening_agree_on_what_fits(
        query: str, records: list[tuple[str, str, dict[str, str] | None]], budget: int, window: int | None,
        tokenizer: object) -> None:
    """One counter: a prompt the input guard accepts within `max_context_tokens`, `shorten` with
    `strict` (no chunk cut) accepts too, and the other way round, over arbitrary Unicode, with the
    package's estimate (fast byte bound first) and with a tokenizer hook."""
    chunks = [{"id": i, "text": t, **({"meta": m} if m is not None else {})} for i, t, m in records]
    lim = load_limits().with_overrides(max_context_tokens=budget)
    try:
        request = validate_request(query, chunks, 1, limits=lim, window_size=window, tokenizer=tokenizer)
        guard_ok = True
    except InputError as exc:
        if any("max_context_tokens" not in v.message for v in exc.violations):
            return  # refused for another reason (an id or text the contract does not take)
        guard_ok = False
        request = validate_request(query, chunks, 1, window_size=window, limits={"max_context_tokens": 2**40})
    try:
        out = shorten(request, max_context_tokens=budget, max_tokens_per_chunk=None, strict=True,
                      window_size=window, tokenizer=tokenizer)
        assert out.request == request and not out.evidence
        short_ok = True
    except InputError:
        short_ok = False
    hypothesis.event(f"fits: {guard_ok}")
    assert guard_ok == short_ok


class _NotPlain(dict):  # type: ignore[type-arg]
    """A dict the guard's memo of plain records does not take (`type(item) is dict` fails): the
    full checks read it, as they read every record that is not a plain dict."""


def _outcome(chunks: object) -> object:
    try:
        return parse_chunks(chunks)
    except InputError as exc:
        return [str(v) for v in exc.violations]


plain_records = st.fixed_dictionaries(
    {"id": st.text(max_size=4), "text": st.text(max_size=8)},
    optional={"score": st.none() | st.floats() | st.integers() | st.booleans()
              | st.sampled_from([0, 0.0, -0.0, 1, 1.0])},
)


@hypothesis.settings(max_examples=300, derandomize=True, deadline=None)
@given(st.lists(plain_records, max_size=4))
@hypothesis.example([{"id": "a", "text": "t", "score": 1}, {"id": "b", "text": "t", "score": 1.0}])
@hypothesis.example([{"id": "a", "text": "t\ud800"}, {"id": "", "text": "t"}])
@hypothesis.example([{"id": "a", "text": "t", "score": None}, {"id": "b", "text": "t", "score": math.nan}])
def test_property_plain_records_memo_reads_as_the_full_checks(recs: list[dict[str, object]]) -> None:
    """A plain `{"id", "text"[, "score"]}` dict takes its `Chunk` from a memo (typed when it has a
    score, keyed on the call's own arguments when not): asked twice (the second time from the memo),
    it gives the chunks or the messages the full checks give for the same records."""
    full = _outcome([_NotPlain(r) for r in recs])
    assert _outcome(recs) == full
    assert _outcome(recs) == full


# --- issue 37, warm: a list of plain records goes straight to its chunks ----------------------------------


def _limited_outcome(chunks: object, limits: dict[str, int], window_size: int | None) -> object:
    try:
        return parse_chunks(chunks, limits=limits, query="q", window_size=window_size)
    except InputError as exc:
        return [(v.path, v.message, v.value, v.line) for v in exc.violations]


@hypothesis.settings(max_examples=200, derandomize=True, deadline=None)
@given(recs=st.lists(st.fixed_dictionaries({"id": st.sampled_from(["a", "b", "c", "\u00e9"]),
                                            "text": st.text(max_size=60)},
                                           optional={"score": st.floats() | st.integers()}), max_size=5),
       max_chunks=st.integers(1, 5), max_context_tokens=st.integers(1, 40),
       window_size=st.none() | st.integers(1, 3))
@hypothesis.example(recs=[{"id": "a", "text": "x" * 50}, {"id": "a", "text": "y"}], max_chunks=1,
                    max_context_tokens=5, window_size=None)
def test_property_a_plain_list_is_read_as_the_record_by_record_path(
        recs: list[dict[str, object]], max_chunks: int, max_context_tokens: int,
        window_size: int | None) -> None:
    """A list (or tuple) of plain, valid records becomes its chunks in one loop, its record places
    made only when a violation names one; the chunks, or every violation (path, message, value,
    line: duplicate ids, too many chunks, over the budget, whole or per window), are those of the
    record-by-record path (records the memo does not take: `_NotPlain`)."""
    limits = {"max_chunks": max_chunks, "max_context_tokens": max_context_tokens}
    full = _limited_outcome([_NotPlain(r) for r in recs], limits, window_size)
    assert _limited_outcome(recs, limits, window_size) == full
    assert _limited_outcome(tuple(recs), limits, window_size) == full


@hypothesis.settings(derandomize=True)
@given(value=st.sampled_from([1, 0, -1, True, False, 1.0, 0.5, -0.0, 2**70, math.nan, math.inf, "1", None])
       | st.floats() | st.integers())
def test_property_exact_type_short_cuts_keep_the_rules(value: object) -> None:
    """`top_k` and `lambda` are judged by their exact type first (an int, a float), then by the
    abstract number classes: the verdict is the rule's either way (a positive integer, not bool;
    a finite number in [0, 1], not bool)."""
    import numbers

    from rag_rerank.guard.input import lambda_violations, top_k_violations

    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    assert (not top_k_violations(value)) == (integral and value >= 1)  # type: ignore[operator]
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    assert (not lambda_violations(value)) == (real and math.isfinite(value) and 0 <= value <= 1)  # type: ignore[arg-type]


@hypothesis.settings(max_examples=200, derandomize=True, deadline=None)
@given(specs=st.lists(st.tuples(st.sampled_from(["a", "b", "\u00e9", "a "]),
                                st.none() | st.integers(1, 3)), min_size=1, max_size=6))
@hypothesis.example(specs=[("a", None), ("a", 2)])
@hypothesis.example(specs=[("a", 1), ("b", None), ("\u00e9", 2)])
def test_property_duplicate_ids_and_dimensions_are_found_from_the_fields(
        specs: list[tuple[str, int | None]]) -> None:
    """The collection rules read each chunk's id and embedding in a loop: a duplicate-id violation
    exactly when an id repeats, a dimensions violation exactly when the embeddings given have more
    than one length (chunks without one do not count)."""
    chunks = [Chunk(cid, "text", None, None, None if dim is None else (0.5,) * dim) for cid, dim in specs]
    try:
        parse_chunks(chunks)
        paths: list[str] = []
    except InputError as exc:
        paths = [v.path for v in exc.violations]
    ids = [cid for cid, _ in specs]
    dims = {dim for _, dim in specs if dim is not None}
    assert ("chunks" in paths) == (len(set(ids)) < len(ids))
    assert ("chunks[*].embedding" in paths) == (len(dims) > 1)


_RECORD_PARTS = st.sampled_from(["", "a", "\u00e9", "\ud800", "\udfff", "\U0001f600", "\ud83d\ude00", " "])
_RECORD_TEXT = st.text(max_size=12) | st.lists(_RECORD_PARTS, max_size=4).map("".join)


@hypothesis.settings(max_examples=300, derandomize=True, deadline=None)
@given(cid=_RECORD_TEXT, text=_RECORD_TEXT)
@hypothesis.example(cid="", text="t")
@hypothesis.example(cid="a\ud800", text="t")
@hypothesis.example(cid="a", text="\u00e9\udfff")
def test_property_a_plain_records_chunk_is_its_checked_chunk(cid: str, text: str) -> None:
    """The `{id, text}` record's chunk, its checks written out (a non-empty id, no lone surrogate in
    either field), is the chunk of every check a record passes (`_scored_chunk` without a score)."""
    from rag_rerank.guard.input import _plain_chunk, _scored_chunk

    assert _plain_chunk.__wrapped__(cid, text) == _scored_chunk.__wrapped__(cid, text, None)
