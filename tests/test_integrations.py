"""What the framework components share (`rag_rerank/integrations/_common.py`) and their import
behaviour: each module needs its extra, and without it says which extra to install."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest

from rag_rerank import InputError, rerank
from rag_rerank.integrations import _common
from rag_rerank.options import ALL_OPTIONS
from rag_rerank.session import SessionCache
from tests.conftest import ROOT

MODULES = [
    ("langchain", "langchain_core", "langchain"),
    ("llama_index", "llama_index", "llama-index"),
    ("haystack", "haystack", "haystack"),
]


def _without(framework: str, body: str) -> subprocess.CompletedProcess[str]:
    """Run `body` in a fresh interpreter in which `framework` cannot be imported (None in
    sys.modules makes `import` fail exactly as for a package that is not installed)."""
    code = f"import sys\nsys.modules[{framework!r}] = None\n" + body
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize(("module", "framework", "extra"), MODULES)
def test_without_the_framework_the_error_names_the_extra(module: str, framework: str, extra: str) -> None:
    done = _without(framework, (
        "from rag_rerank import MissingDependencyError\n"
        "import rag_rerank, rag_rerank.integrations\n"  # the package itself never needs the framework
        "try:\n"
        f"    import rag_rerank.integrations.{module}\n"
        "except MissingDependencyError as exc:\n"
        "    print(exc.extra, '|', exc)\n"
    ))
    assert done.returncode == 0, done.stderr
    extra_seen, message = done.stdout.split("|", 1)
    assert extra_seen.strip() == extra
    assert f"pip install 'rag-rerank[{extra}]'" in message


@pytest.mark.parametrize(("module", "framework", "extra"), MODULES)
def test_the_optional_import_idiom_catches_a_missing_framework(
    module: str, framework: str, extra: str
) -> None:
    """Regression: `try: import ...integrations.X / except ImportError:` (how an application makes a
    framework optional) let MissingDependencyError through, a crash instead of the fallback."""
    done = _without(framework, (
        "try:\n"
        f"    import rag_rerank.integrations.{module}\n"
        "except ImportError as exc:\n"
        "    print('fallback |', exc)\n"
    ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("fallback |") and f"rag-rerank[{extra}]" in done.stdout


def test_importing_rag_rerank_does_not_import_any_framework() -> None:
    code = ("import sys, rag_rerank, rag_rerank.integrations, rag_rerank.integrations._common\n"
            "print(sorted(m for m in ('langchain_core', 'llama_index', 'haystack') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_option_names_are_rerank_options() -> None:
    """A component passes on every keyword of rerank() (the session and request options, one list
    in `rag_rerank.options`) but the count, which each framework names itself."""
    params = [p for p in ALL_OPTIONS if p != "top_k"]
    assert list(_common.rerank_option_names()) == params
    for name in ("lambda_", "backend", "model", "base_url", "api_key", "embedder", "fallback", "policy",
                 "layout", "strict"):
        assert name in params


def test_check_options_names_every_bad_option_at_once() -> None:
    with pytest.raises(InputError) as err:
        _common.check_options({"lamda_": 1, "top_k": 3, "duplicate_threshold": 0.9},
                              component="X", count_name="top_n")
    paths = [v.path for v in err.value.violations]
    assert paths == ["lamda_", "top_k"]
    assert "'top_n'" in str(err.value)
    assert _common.check_options({"duplicate_threshold": 0.9}, component="X", count_name="top_n") == {
        "duplicate_threshold": 0.9}


def test_placed_maps_ids_back_to_positions() -> None:
    ids = ["b", "a", "c"]
    result = rerank("capital of France", [{"id": "b", "text": "Paris is the capital of France"},
                                          {"id": "a", "text": "bananas are yellow"},
                                          {"id": "c", "text": "France has Paris as capital"}], 1)
    ranked, dropped = _common.placed(result, ids)
    assert [ids[i] for i, _ in ranked] == result.ids
    assert sorted(i for i, _ in ranked + dropped) == [0, 1, 2]


def test_named_metadata_of_loader_types_reaches_the_reranker_as_plain_json() -> None:
    """DataFrame loaders give numpy scalars, SQL loaders Decimals, others UUIDs and paths: the keys
    meta_field / embed_meta_fields name are sent as the plain values they stand for, so fusion
    works instead of "meta is not plain JSON" for every document."""
    import datetime
    import decimal
    import pathlib
    import uuid

    import numpy as np

    metas = [{"year": np.int64(2019), "rating": decimal.Decimal("4.5"), "title": pathlib.Path("a/b.md"),
              "key": uuid.UUID(int=1), "at": datetime.time(3, 4), "other": object()},
             {"year": np.int64(2024), "rating": np.float32(2.5), "title": "b", "key": decimal.Decimal("12")}]
    options = {"meta_field": "year", "embed_meta_fields": ["title", "rating", "key", "at"]}
    recs = _common.records(["a", "b"], ["x", "y"], metas, options)
    assert recs[0]["meta"] == {"year": 2019, "title": "a/b.md", "rating": 4.5,
                               "key": "00000000-0000-0000-0000-000000000001", "at": "03:04:00"}
    assert recs[1]["meta"] == {"year": 2024, "title": "b", "rating": 2.5, "key": 12}
    assert type(recs[0]["meta"]["year"]) is int and type(recs[1]["meta"]["rating"]) is float
    texts = ["Paris is the capital of France", "Paris has about two million inhabitants"]
    newest = _common.run(SessionCache(), "capital of France", ["old", "new"], texts, 2,
                         {"meta_field": "year", "lambda_": 1.0},
                         [{"year": np.int64(2019)}, {"year": np.int64(2024)}])
    assert newest.ids == ["new", "old"]


def _doc_examples() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "integrations.md").read_text(encoding="utf-8")
    return re.findall(r"<!-- example: (\w+) -->\n```python\n(.*?)\n```", text, re.DOTALL)


def test_every_framework_has_a_runnable_example() -> None:
    assert sorted(name for name, _ in _doc_examples()) == ["haystack", "langchain", "llama_index"]


@pytest.mark.parametrize(("name", "code"), _doc_examples(), ids=[n for n, _ in _doc_examples()])
def test_docs_examples_run(name: str, code: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip({"langchain": "langchain_classic", "llama_index": "llama_index.core",
                         "haystack": "haystack"}[name])
    exec(compile(code, f"docs/integrations.md:{name}", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed and printed[0].startswith("paris ")  # the capital passage ranks first


@pytest.mark.parametrize(("module", "name"), [("langchain", "RagRerankCompressor"),
                                              ("llama_index", "RagRerankPostprocessor"),
                                              ("haystack", "RagRerankRanker")])
def test_a_component_refuses_a_model_its_backend_would_ignore_when_built(module: str, name: str) -> None:
    """Regression: `RagRerankCompressor(model="gpt-4o-mini")` (no backend="openai") ranked with the
    local scorer, silently; a model for the primary backend with fallback="local" is fine."""
    import importlib

    pytest.importorskip({"langchain": "langchain_core", "llama_index": "llama_index.core",
                         "haystack": "haystack"}[module])
    component = getattr(importlib.import_module(f"rag_rerank.integrations.{module}"), name)
    with pytest.raises(InputError) as exc:
        component(model="gpt-4o-mini")
    [violation] = exc.value.violations
    assert violation.path == "model" and "the local backend takes no model" in violation.message
    with pytest.raises(InputError, match="the cross-encoder backend takes no base_url"):
        component(backend="cross-encoder", model="m", base_url="http://127.0.0.1:8000/v1")
    component(backend="openai", model="gpt-4o-mini", base_url="http://127.0.0.1:9/v1", fallback="local")


@pytest.mark.parametrize("component", ["langchain", "llama_index"])
def test_a_components_repr_masks_a_password_in_base_url(component: str) -> None:
    """A component's repr lands in logs and tracebacks; the key is a SecretStr, and the base URL's
    password is masked the same way errors mask it."""
    if component == "langchain":
        pytest.importorskip("langchain_core")
        from rag_rerank.integrations.langchain import RagRerankCompressor as cls
    else:
        pytest.importorskip("llama_index.core")
        from rag_rerank.integrations.llama_index import RagRerankPostprocessor as cls
    made = cls(backend="openai", model="m", base_url="http://user:pw-SECRET-1@127.0.0.1:1/v1?api-key=QK-123456",
               api_key="sk-abcdefgh1234")
    for text in (repr(made), str(made)):
        assert "pw-SECRET-1" not in text and "QK-123456" not in text and "sk-abcdefgh1234" not in text
        assert "http://user:***@127.0.0.1:1/v1?api-key=***" in text


@pytest.mark.parametrize("module", ["langchain", "llama_index", "haystack"])
def test_a_component_passes_a_fallback_chain_through(module: str) -> None:
    """The backend is unreachable; the chain's "input" step answers, and the component's
    `last_result.meta` says how (status, fallback, fallback_steps), as `rerank` does."""
    pytest.importorskip({"langchain": "langchain_core", "llama_index": "llama_index.core",
                         "haystack": "haystack"}[module])
    texts = ["Paris is the capital of France", "Lyon is a city in France", "Bread needs flour"]
    options = {"backend": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1", "api_key": "sk-x",
               "fallback": ["input"]}
    if module == "langchain":
        from langchain_core.documents import Document as LCDocument

        from rag_rerank.integrations.langchain import RagRerankCompressor

        component: Any = RagRerankCompressor(top_n=2, **options)
        component.compress_documents([LCDocument(page_content=t, id=f"d{i}") for i, t in enumerate(texts)],
                                     "capital of France")
    elif module == "llama_index":
        from llama_index.core.schema import NodeWithScore, TextNode

        from rag_rerank.integrations.llama_index import RagRerankPostprocessor

        component = RagRerankPostprocessor(top_n=2, **options)
        component.postprocess_nodes([NodeWithScore(node=TextNode(text=t, id_=f"d{i}")) for i, t in
                                     enumerate(texts)], query_str="capital of France")
    else:
        from haystack import Document as HSDocument
        from haystack.utils import Secret

        from rag_rerank.integrations.haystack import RagRerankRanker

        component = RagRerankRanker(top_k=2, **{**options, "api_key": Secret.from_token("sk-x")})
        component.run("capital of France", [HSDocument(content=t, id=f"d{i}") for i, t in enumerate(texts)])
    meta = component.last_result.meta
    assert (meta.status, meta.fallback) == ("fallback", "input")
    assert [s["scorer"] for s in meta.fallback_steps[0]["steps"]] == ["openai", "input"]
    assert component.last_result.ids == ["d0", "d1"]
