"""The skill card loader (rag_rerank/skill.py) and the card itself against the seed it implements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rag_rerank.guard import load_limits, validate_request
from rag_rerank.skill import (
    ALLOWED_TOP_LEVEL,
    RoutingExample,
    SkillCard,
    SkillCardError,
    load_all_skills,
    load_skill,
    parse_skill,
)
from tests.support.shared_data import seeds_dir

SEED = seeds_dir() / "skill-card-rag-chunk-reranker.txt"


def seed_text() -> str:
    if not SEED.is_file():
        pytest.skip("the seed card is not on this machine")
    return SEED.read_text(encoding="utf-8")


def seed_list(text: str, header: str, stop: str) -> list[str]:
    start = text.index(f"\n{header}\n") + len(header) + 2
    block = text[start : text.index(f"\n{stop}\n", start)]
    return [line[2:] for line in block.splitlines() if line.startswith("- ")]


def test_front_matter_follows_the_agent_skills_spec(card: SkillCard) -> None:
    raw = card.path.read_text(encoding="utf-8")
    front = yaml.safe_load(raw.split("---\n")[1])
    assert set(front) <= ALLOWED_TOP_LEVEL
    assert {"name", "description", "metadata"} <= set(front)
    assert card.name == "rag-chunk-reranker" == card.path.parent.name
    assert 0 < len(front["description"]) <= 1024
    # the spec: metadata maps string keys to string values
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in front["metadata"].items())


def test_inputs_and_defaults(card: SkillCard) -> None:
    assert [(i.name, i.required, i.default) for i in card.inputs] == [
        ("query", True, None),
        ("chunks", True, None),
        ("top_k", False, 5),
        ("lambda", False, 0.7),
        ("meta_field", False, None),
        ("meta_weight", False, 1.0),
        ("meta_ranking_mode", False, "reciprocal_rank_fusion"),
        ("meta_sort_order", False, "descending"),
        ("missing_meta", False, "bottom"),
        ("meta_value_type", False, "float"),
        ("embed_meta_fields", False, None),
        ("window_size", False, None),
        ("max_tokens_per_chunk", False, None),
    ]
    # The card's defaults are the library's: a tool call that omits an option gets what rerank() does.
    from rag_rerank.options import Options

    for spec in card.inputs[4:]:
        assert getattr(Options(), spec.name) == spec.default, spec.name
    lim = load_limits()
    assert (card.default("top_k"), card.default("lambda")) == (lim.default_top_k, lim.default_lambda)
    assert card.max_chunks == lim.max_chunks == 50


def test_triggers_not_for_and_description_match_the_seed(card: SkillCard) -> None:
    text = seed_text()
    assert list(card.triggers) == seed_list(text, "triggers", "not for")
    assert list(card.not_for) == seed_list(text, "not for", "prompt")
    assert card.description == " ".join(text[text.rindex("\ndescription\n") + 13 :].split())
    assert card.title == text.splitlines()[0]
    assert card.summary == text.splitlines()[1]


def test_examples_match_the_seed(card: SkillCard) -> None:
    text = seed_text()
    for name in ("adversarial", "happy-path"):
        start = text.index(f"case · {name}\n") + len(f"case · {name}\n")
        seed_case = json.JSONDecoder().raw_decode(text, start)[0]
        ex = card.example(name)
        assert (ex.query, ex.chunks, ex.top_k, ex.lambda_) == (
            seed_case["query"],
            seed_case["chunks"],
            seed_case["top_k"],
            seed_case["lambda"],
        )
        assert validate_request(ex.query, ex.chunks, ex.top_k, ex.lambda_)


def test_examples_folder_matches_the_card(card: SkillCard, repo_root: Path) -> None:
    for name in ("adversarial", "happy-path"):
        assert (repo_root / "examples" / f"{name}.jsonl").read_text(encoding="utf-8") == card.example(
            name
        ).chunks


def test_lookups_and_listing(card: SkillCard) -> None:
    assert card.tool_name == "rerank_chunks"
    with pytest.raises(KeyError):
        card.input("nope")
    with pytest.raises(KeyError):
        card.example("nope")
    assert [c.name for c in load_all_skills()] == ["rag-chunk-reranker"]
    with pytest.raises(SkillCardError, match="no skill card 'missing'"):
        load_skill("missing")


GOOD = """---
name: demo
description: A demo.
metadata:
  version: "1"
  inputs: |
    - {name: query, required: true, type: string}
  routing: |
    {triggers: [do it], not_for: [other]}
---
body
"""


def write_card(tmp_path: Path, text: str, folder: str = "demo") -> Path:
    p = tmp_path / folder / "SKILL.md"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


def test_minimal_card_parses(tmp_path: Path) -> None:
    card = parse_skill(write_card(tmp_path, GOOD))
    assert (card.name, card.triggers, card.not_for, card.body) == ("demo", ("do it",), ("other",), "body\n")
    assert card.tool_name == "demo" and card.max_chunks == 50 and card.examples == ()
    assert card.route_examples == () and card.reject_examples == ()
    assert parse_skill(write_card(tmp_path, GOOD.replace("\n", "\r\n"), "demo")).name == "demo"


def test_routing_example_utterances_parse(tmp_path: Path, card: SkillCard) -> None:
    text = GOOD.replace(
        "{triggers: [do it], not_for: [other]}",
        "{triggers: [do it], not_for: [other], route_examples: ['please  do it'], reject_examples: [nope]}",
    )
    demo = parse_skill(write_card(tmp_path, text))
    assert (demo.route_examples, demo.reject_examples) == (("please do it",), ("nope",))
    # The packaged card carries its own example utterances, next to the seed's triggers.
    assert card.route_examples and card.reject_examples


@pytest.mark.parametrize(
    ("text", "folder", "expected"),
    [
        (
            GOOD.replace("not_for: [other]}", "not_for: [other], route_examples: [ok, 3]}"),
            "demo",
            "metadata.routing.route_examples must be a list of non-empty strings",
        ),
        (
            # YAML reads a bare `no` as false: an example utterance must be quoted, not lost.
            GOOD.replace("not_for: [other]}", "not_for: [other], reject_examples: [no]}"),
            "demo",
            "metadata.routing.reject_examples must be a list of non-empty strings",
        ),
        ("no front matter", "demo", "must start with a '---'"),
        ("---\nname: demo\n", "demo", "not closed"),
        ("---\n- a list\n---\n", "demo", "front matter must be a mapping"),
        ("---\nname: [unclosed\n---\n", "demo", "not valid YAML"),
        (GOOD.replace("name: demo", "name: demo\nversion: 1"), "demo", "top-level keys not allowed"),
        (GOOD, "other", "name 'demo' must match its folder 'other'"),
        (GOOD.replace("metadata:", "meta:"), "demo", "top-level keys not allowed"),
        (
            GOOD.replace("  routing: |\n    {triggers: [do it], not_for: [other]}\n", ""),
            "demo",
            "missing key metadata.routing",
        ),
        (
            GOOD.replace("{name: query, required: true, type: string}", "{name: query}"),
            "demo",
            "malformed metadata",
        ),
        (GOOD.replace("description: A demo.\n", ""), "demo", "missing key description"),
        (GOOD.replace('version: "1"', "version: 1"), "demo", "metadata.version must be a string"),
        (
            GOOD.replace(
                "  routing: |\n    {triggers: [do it], not_for: [other]}", "  routing: {triggers: [x]}"
            ),
            "demo",
            "metadata.routing must be a string",
        ),
        (
            GOOD.replace("    {triggers: [do it], not_for: [other]}", "    {triggers: [unclosed"),
            "demo",
            "metadata.routing is not valid YAML",
        ),
        (GOOD.replace("name: demo", "name: Demo"), "Demo", "must be 1-64 lowercase letters"),
        (GOOD.replace("name: demo", "name: de--mo"), "de--mo", "must be 1-64 lowercase letters"),
        (
            GOOD.replace("description: A demo.", "description: " + "x" * 1025),
            "demo",
            "at most 1024 characters",
        ),
        (
            GOOD.replace("metadata:", "compatibility: ''\nmetadata:"),
            "demo",
            "compatibility must be a string of 1-500",
        ),
    ],
)
def test_bad_cards_raise_skill_card_error(tmp_path: Path, text: str, folder: str, expected: str) -> None:
    with pytest.raises(SkillCardError, match=expected.replace("[", r"\[").replace(".", r"\.")):
        parse_skill(write_card(tmp_path, text, folder))


# --- the routing examples file ----------------------------------------------------------------

WITH_FILE = GOOD.replace(
    "{triggers: [do it], not_for: [other]}",
    "{triggers: [do it], not_for: [other], count_nouns: [rows], examples_file: ex.jsonl}",
)


def test_routing_examples_file_parses(tmp_path: Path, card: SkillCard) -> None:
    path = write_card(tmp_path, WITH_FILE)
    (path.parent / "ex.jsonl").write_text(
        '{"utterance": "please  do it", "route": true, "n_chunks": 3, "category": "p", "source": "a"}\n'
        "\n"
        '{"utterance": "something else", "route": false}\n',
        encoding="utf-8",
    )
    demo = parse_skill(path)
    assert demo.count_nouns == ("rows",)
    assert demo.routing_examples == (
        RoutingExample("please do it", True, 3, "p", "a"),
        RoutingExample("something else", False, None, "", ""),
    )
    # The packaged card has its labelled requests, from several sources.
    assert len({e.source for e in card.routing_examples}) >= 5


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("not json", "ex.jsonl:2: not JSON"),
        ("[1, 2]", "ex.jsonl:2: must be a JSON object"),
        ('{"utterance": "", "route": true}', "ex.jsonl:2: utterance must be a non-empty string"),
        ('{"utterance": "x", "route": "yes"}', "ex.jsonl:2: route must be true or false, got 'yes'"),
        ('{"utterance": "x", "route": true, "n_chunks": -1}', "ex.jsonl:2: n_chunks must be a non-negative"),
        ('{"utterance": "x", "route": true, "n_chunks": true}', "ex.jsonl:2: n_chunks must be"),
        ('{"utterance": "x", "route": true, "source": 3}', "ex.jsonl:2: category and source must be strings"),
    ],
)
def test_a_bad_routing_example_line_is_a_card_error_naming_it(
    tmp_path: Path, line: str, expected: str
) -> None:
    path = write_card(tmp_path, WITH_FILE)
    good = '{"utterance": "ok", "route": true}\n'
    (path.parent / "ex.jsonl").write_text(good + line + "\n", encoding="utf-8")
    with pytest.raises(SkillCardError) as info:
        parse_skill(path)
    assert expected in str(info.value)


@pytest.mark.parametrize("name", ["../outside.jsonl", "/etc/passwd", "", "missing.jsonl"])
def test_the_examples_file_must_be_a_readable_file_in_the_skill_folder(tmp_path: Path, name: str) -> None:
    path = write_card(tmp_path, WITH_FILE.replace("examples_file: ex.jsonl", f"examples_file: '{name}'"))
    with pytest.raises(SkillCardError) as info:
        parse_skill(path)
    assert "examples_file must be a file name inside the skill folder" in str(info.value) or (
        "cannot read the routing examples" in str(info.value)
    )


def test_examples_file_lines_are_split_on_newlines_only(tmp_path: Path) -> None:
    """JSON may hold U+2028, U+0085 or U+001E raw inside a string; `str.splitlines` split on them,
    so a valid file was refused, and every error after such a line named the wrong line."""
    path = write_card(tmp_path, WITH_FILE)
    odd = '{"utterance": "rank\\u2028these\\u0085hits\\u001e now", "route": true}'
    (path.parent / "ex.jsonl").write_text(
        json.dumps({"utterance": "rank\u2028these\u0085hits\u001e now", "route": True}, ensure_ascii=False)
        + "\r\n" + odd + "\r\n", encoding="utf-8"
    )
    assert [e.utterance for e in parse_skill(path).routing_examples] == ["rank these hits now"] * 2
    (path.parent / "ex.jsonl").write_text(
        json.dumps({"utterance": "a\u2028b", "route": True}, ensure_ascii=False) + "\n\nnot json\n",
        encoding="utf-8",
    )
    with pytest.raises(SkillCardError, match=r"ex\.jsonl:3: not JSON"):
        parse_skill(path)


OK_LINE = b'{"utterance": "ok", "route": true}\n'


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ('{"utterance": "do it", "route": true}\n'.encode("utf-16"),
         "ex.jsonl:1: not UTF-8 text (byte 0) (it looks like UTF-16; save it as UTF-8)"),
        (b'{"utterance": "ok", "route": true}\n{"utterance": "caf\xe9", "route": true}\n',
         "ex.jsonl:2: not UTF-8 text (byte 53)"),
        (OK_LINE + b"[" * 100_000 + b"\n", "ex.jsonl:2: not JSON (nested too deeply)"),
        (OK_LINE + b'{"utterance": "x", "route": true, "n_chunks": ' + b"9" * 5000 + b"}\n",
         "ex.jsonl:2: not JSON (Exceeds the limit"),
    ],
    ids=["utf-16", "latin-1", "deep nesting", "a 5,000-digit number"],
)
def test_an_unreadable_examples_file_names_the_line(tmp_path: Path, data: bytes, expected: str) -> None:
    """Was: a RecursionError escaping the loader, a card error naming SKILL.md for the 5,000-digit
    number, and a codec message with a byte offset but no line."""
    path = write_card(tmp_path, WITH_FILE)
    (path.parent / "ex.jsonl").write_bytes(data)
    with pytest.raises(SkillCardError) as info:
        parse_skill(path)
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("routing", "expected"),
    [
        ("{triggers: [[do it]], not_for: [other]}", "routing.triggers must be a list of non-empty strings"),
        ("{triggers: do it, not_for: [other]}", "routing.triggers must be a list of non-empty strings"),
        ("{triggers: [do it], not_for: [{a: 1}]}", "routing.not_for must be a list of non-empty strings"),
        ("[do it]", "metadata.routing must be a YAML mapping (triggers:, not_for:, ...), got list"),
        ("{triggers: [do it], max_chunks: -5}", "routing.max_chunks must be a positive integer, got -5"),
        ("{triggers: [do it], max_chunks: 0}", "max_chunks must be a positive integer, got 0"),
        ("{triggers: [do it], max_chunks: true}", "max_chunks must be a positive integer, got True"),
        ("{triggers: [do it], max_chunks: 50.5}", "max_chunks must be a positive integer, got 50.5"),
        ("{triggers: [do it], max_chunks: lots}", "max_chunks must be a positive integer, got 'lots'"),
    ],
)
def test_bad_routing_fields_are_card_errors_naming_the_key(
    tmp_path: Path, routing: str, expected: str
) -> None:
    """Was: a string of triggers read as one trigger per character, an AttributeError from the
    router for a nested list, `true` read as a limit of 1 and -5 as a limit that refuses all."""
    text = GOOD.replace("{triggers: [do it], not_for: [other]}", routing)
    with pytest.raises(SkillCardError) as info:
        parse_skill(write_card(tmp_path, text))
    assert expected in str(info.value)


def test_a_skills_root_that_is_not_a_folder_is_an_error(tmp_path: Path) -> None:
    """A mistyped `skills_root` used to look like a folder without cards: every route abstained."""
    with pytest.raises(SkillCardError, match="no such skills folder"):
        load_all_skills(tmp_path / "skils")
    assert load_all_skills(tmp_path) == []
    write_card(tmp_path, GOOD)
    assert [c.name for c in load_all_skills(str(tmp_path))] == ["demo"]  # a str too, not only a Path
