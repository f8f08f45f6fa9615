"""The one table of options (`rag_rerank/options.py`, `OPTIONS`): every `RerankOptions` key, every
field of `Options`, every option flag of the command line and every option the docs list come from
it, with the same type, default, choices and help; its checks are the ones a request meets."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_rerank import InputError, rerank
from rag_rerank.backends.common import HTTP_TRANSPORTS
from rag_rerank.backends.factory import BACKEND_OPTIONS, BACKENDS
from rag_rerank.backends.openai import SCORINGS
from rag_rerank.cli import build_parser
from rag_rerank.options import (
    OPTION,
    OPTIONS,
    REQUEST_OPTIONS,
    SESSION_OPTIONS,
    Options,
    RerankOptions,
    option_violations,
    request_options,
)

ROOT = Path(__file__).resolve().parent.parent

# Flags of the commands that are not rerank options: what the command reads or writes, how it
# reports, and the measuring commands' own settings. Any other flag must come from the table.
COMMAND_FLAGS = {
    "--help", "--version", "--query", "--chunks", "--scores", "--meta", "--indent", "--dry-run", "--input",
    "--output", "--resume", "--overwrite", "--no-progress", "--engine", "--ray-address", "--workers",
    "--candidates", "--qrels", "--depth", "--seed", "--json", "--rel-level", "--split", "--method", "--k",
    "--subtopics", "--repair", "--verbose", "--older-than", "--n-chunks", "--html",
    # compare's statistics and gate
    "--metric", "--fail-if-worse", "--alpha", "--resamples", "--confidence", "--ci", "--top",
    # serve's server
    "--host", "--port", "--config", "--api-keys-file", "--log-level",
}
# A command whose flag of that name is its own, not the option's (`cache stats --cache DIR` names
# the cache to read; it sets no rerank option).
OWN_FLAGS = {("cache", "--cache")}


def _subcommands(parser: argparse.ArgumentParser, prefix: str = ""
                 ) -> list[tuple[str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:  # argparse keeps its parsers here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append((f"{prefix}{name}", sub))
                out.extend(_subcommands(sub, f"{prefix}{name} "))
    return out


TABLE_FLAGS = {f.name: f for o in OPTIONS for f in o.flags}


def test_the_table_declares_each_option_once() -> None:
    names = [o.name for o in OPTIONS]
    assert len(names) == len(set(names))
    assert set(SESSION_OPTIONS) | set(REQUEST_OPTIONS) == set(names)
    assert not set(SESSION_OPTIONS) & set(REQUEST_OPTIONS)
    flags = [f.name for o in OPTIONS for f in o.flags]
    assert len(flags) == len(set(flags)), "a flag declared twice"
    assert {o.scope for o in OPTIONS} == {"session", "request"}
    assert all(o.doc and not o.doc.endswith(".") for o in OPTIONS)


def test_rerank_options_is_the_table_for_type_checkers() -> None:
    """`RerankOptions` (a TypedDict type checkers read) states exactly the table's keyword options,
    with the table's types; `top_k` and `lambda_` are positional parameters of `rerank`."""
    keywords = {o.name: o.type for o in OPTIONS if not o.positional}
    stated = {k: getattr(v, "__forward_arg__", v) for k, v in RerankOptions.__annotations__.items()}
    assert stated == keywords


def test_options_fields_and_defaults_are_the_tables_request_options() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(Options)}
    assert list(fields) == list(REQUEST_OPTIONS)
    assert fields == {o.name: o.default for o in request_options()}


def test_every_cli_flag_of_an_option_comes_from_the_table() -> None:
    """Each flag of each command is the table's (same names, help, choices, default) or one of the
    commands' own (COMMAND_FLAGS); a flag added by hand to a command fails here."""
    seen = set()
    for command, parser in _subcommands(build_parser()):
        for action in parser._actions:
            for name in action.option_strings:
                if not name.startswith("--") or name in COMMAND_FLAGS or (command, name) in OWN_FLAGS:
                    continue
                assert name in TABLE_FLAGS, f"rag-rerank {command} {name} is not declared in options.OPTIONS"
                flag = TABLE_FLAGS[name]
                seen.add(name)
                assert tuple(action.option_strings) == flag.names, (command, name)
                what = "the whole batch" if command == "batch" else "the rerank"
                assert action.help == flag.help_for(command).replace("{what}", what), (command, name)
                assert (tuple(action.choices) if action.choices else None) == flag.choices, (command, name)
                if flag.kind not in ("switch", "append"):
                    assert action.default == flag.default, (command, name)
    assert seen == set(TABLE_FLAGS), f"flags of the table no command takes: {set(TABLE_FLAGS) - seen}"


def test_the_flags_choices_are_the_ones_the_code_takes() -> None:
    assert OPTION["backend"].choices == BACKENDS == tuple(BACKEND_OPTIONS)
    assert TABLE_FLAGS["--scoring"].choices == SCORINGS
    assert TABLE_FLAGS["--http"].choices == HTTP_TRANSPORTS
    knobs = {f.dest or f.name[2:].replace("-", "_") for f in OPTION["backend_options"].flags}
    assert knobs <= {k for takes in BACKEND_OPTIONS.values() for k in takes}


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("options_table", ROOT / "scripts" / "options_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_documented_options_are_the_table() -> None:
    """docs/library.md's options table is the one `scripts/options_table.py` writes from the table,
    and names each option once."""
    script = _script()
    text = (ROOT / "docs" / "library.md").read_text(encoding="utf-8")
    assert script.rewritten(text) == text, "run python scripts/options_table.py"
    documented = re.findall(r"^\| `([a-z_]+)` \|", script.table(), re.M)
    assert documented == [o.name for o in OPTIONS]


BAD_VALUES = {"fallback": "remote", "policy": {"max_attempts": 2}, "layout": "mmrr",
              "duplicate_threshold": 1.5, "strict": "no", "concurrency": 0, "consistency": 21}


@pytest.mark.parametrize(("name", "value"), sorted(BAD_VALUES.items()))
def test_each_checked_option_is_refused_by_its_check_in_the_table(name: str, value: Any) -> None:
    option = OPTION[name]
    assert option.check is not None and [v.path for v in option.violations(value)] == [name]
    assert option.violations(option.default) == []
    with pytest.raises(InputError) as raised:
        rerank("q", [{"id": "a", "text": "q"}], **{name: value})
    assert name in {v.path for v in raised.value.violations}


def test_the_checks_report_every_bad_option_at_once() -> None:
    problems = option_violations(Options(**BAD_VALUES))
    assert sorted(v.path for v in problems) == sorted(BAD_VALUES)


def test_request_options_list_what_a_request_may_set_with_type_default_and_check() -> None:
    """What an HTTP service (or any new surface) reads to accept, check and document a request."""
    listed = request_options()
    assert [o.name for o in listed] == list(REQUEST_OPTIONS)
    assert all(o.type and o.doc and "request" in o.surfaces for o in listed)
    assert all(o.check is not None or o.checked_with for o in OPTIONS)


def test_a_plan_holds_the_options_as_typed_settings_read_once() -> None:
    """`plan()` turns the checked options into typed values once (`options.Settings`); the flow
    reads those, not the options as given."""
    from rag_rerank.backends.factory import make_backend
    from rag_rerank.embed import get_embedder
    from rag_rerank.engine import plan
    from rag_rerank.options import Settings, settings_of
    from rag_rerank.retry import RetryPolicy
    from rag_rerank.steps import Setup

    assert settings_of(Options()) == Settings(policy=settings_of(Options()).policy)
    typed = settings_of(Options(duplicate_threshold=1, concurrency=3, strict=True))
    assert typed.duplicate_threshold == 1.0 and isinstance(typed.duplicate_threshold, float)
    assert typed.concurrency == 3 and typed.strict is True and isinstance(typed.policy, RetryPolicy)
    setup = Setup(make_backend("local"), "local", get_embedder("lexical"))
    planned = plan(setup, "q", [{"id": "a", "text": "q"}], Options(layout="diversity", consistency=2))
    assert planned.settings.layout == "diversity" and planned.settings.consistency == 2


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.dictionaries(st.sampled_from(REQUEST_OPTIONS),
                       st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5)),
                       max_size=6))
def test_merged_is_what_dataclasses_replace_makes(overrides: dict[str, Any]) -> None:
    """`Options.merged` copies the fields itself (faster than `dataclasses.replace`): the same
    value, field by field and by type, and the options it was made from untouched."""
    base = Options(top_k=3, fallback="local", layout="diversity")
    before = dataclasses.astuple(base)
    out = base.merged(overrides)
    expected = dataclasses.replace(base, **overrides)
    assert out == expected and type(out) is Options
    assert [type(getattr(out, f.name)) for f in dataclasses.fields(Options)] == \
        [type(getattr(expected, f.name)) for f in dataclasses.fields(Options)]
    assert list(vars(out)) == list(vars(expected))  # the same fields, in the same order
    assert dataclasses.astuple(base) == before


_SETTING_VALUES = st.fixed_dictionaries({
    "fallback": st.sampled_from([None, "local", ["local"]]),
    "duplicate_threshold": st.sampled_from([None, 1, 1.0, 0.5]),
    "strict": st.sampled_from([False, True]),
    "concurrency": st.sampled_from([1, 3]),
    "consistency": st.sampled_from([1, 2]),
    "layout": st.sampled_from(["mmr", "diversity"]),
    "embed_meta_fields": st.sampled_from([None, ("source",), ["source"]]),
    "meta_field": st.sampled_from([None, "year"]),
    "meta_weight": st.sampled_from([1.0, 0.5, 1]),
    "prices": st.sampled_from([None, {"input": 1, "output": 2}, "prices"]),
    "budget": st.sampled_from([None, {"max_calls": 3}]),
})


@settings(max_examples=120, deadline=None, derandomize=True)
@given(st.lists(_SETTING_VALUES, min_size=1, max_size=6), st.data())
def test_the_options_are_read_again_unless_they_are_the_same_fixed_objects(
        given_values: list[dict[str, Any]], data: st.DataObject) -> None:
    """`check_request_options` remembers the last options read when every value is the very object
    it was read from and cannot change in place (a session's calls share its defaults): for any
    sequence of options, some sharing the last one's objects, some of those changed in place (a
    list, a dict), what it reads is what a fresh read gives, field by field, value and type (1 and
    True, 1 and 1.0 are not taken for each other; a list of fallback steps is read again)."""
    from rag_rerank.cost import Prices, as_budget, as_prices
    from rag_rerank.fusion import check_embed_meta_fields, meta_fusion
    from rag_rerank.guard.limits import as_limits
    from rag_rerank.options import Settings, check_request_options
    from rag_rerank.retry import RetryPolicy

    chunks = [{"id": "a", "text": "t", "meta": {"year": 2020, "source": "s", "title": "x"}}]
    previous: Options | None = None
    for values in given_values:
        if previous is not None and data.draw(st.booleans(), label="reuse the last options' objects"):
            options = previous.merged({"top_k": 3})
            fields = options.embed_meta_fields
            if isinstance(fields, list) and data.draw(st.booleans(), label="add a field"):
                fields.append("title")
            if isinstance(options.prices, dict) and data.draw(st.booleans(), label="change the price"):
                options.prices["input"] += 1
        else:
            given_prices = values["prices"]
            values = {**values, "prices": Prices(1.0, 2.0) if given_prices == "prices" else given_prices}
            options = Options(**values)
        threshold = options.duplicate_threshold
        fresh = Settings(fallback=options.fallback, policy=options.policy or RetryPolicy(),
                         layout=options.layout,
                         duplicate_threshold=None if threshold is None else float(threshold),
                         strict=bool(options.strict), concurrency=int(options.concurrency),
                         consistency=int(options.consistency))
        got = check_request_options("q", chunks, options, as_limits(options.limits))
        assert got.settings == fresh and repr(got.settings) == repr(fresh)
        assert got.settings.chain == fresh.chain
        prices = as_prices(options.prices)
        assert got.prices == prices and repr(got.prices) == repr(prices)
        assert got.budget == as_budget(options.budget, prices)
        assert got.embed_fields == check_embed_meta_fields(options.embed_meta_fields)
        scoring = {k: v for k, v in options.scoring().items() if k != "embed_meta_fields"}
        fusion = meta_fusion(**scoring)
        assert got.fusion == fusion and repr(got.fusion) == repr(fusion)
        previous = options
