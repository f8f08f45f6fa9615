"""The default lexical embedder: deterministic across processes, unit rows, copies close, topics apart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rag_rerank.embed import CallerVectors, get_embedder
from rag_rerank.embed.lexical import LexicalEmbedder, normalise_text
from rag_rerank.errors import InputError
from tests.support.shared_data import data_dir, require

CLOUGH = data_dir() / "clough-stevenson"
TEXTS = [
    "HNSW builds a hierarchical proximity graph; recall ~99% with low latency but RAM-heavy.",
    "IVF partitions vectors into Voronoi cells; only nprobe lists are scanned per query.",
    "Cooking risotto requires constant stirring and warm stock.",
    "東京は日本の首都です。",
]


def test_shape_dtype_and_unit_rows():
    emb = LexicalEmbedder()
    m = emb.embed([*TEXTS, "...!!!"])
    assert m.shape == (5, emb.dim) and m.dtype == np.float32
    assert np.allclose(np.linalg.norm(m[:4], axis=1), 1.0, atol=1e-5)
    assert not m[4].any()  # no word characters: a zero row, not NaN
    assert emb.embed([]).shape == (0, emb.dim)


def test_a_vector_depends_only_on_its_own_text():
    emb = LexicalEmbedder()
    alone = emb.embed([TEXTS[1]])[0]
    together = emb.embed(TEXTS)[1]
    assert np.array_equal(alone, together)


def test_same_vectors_in_another_process_with_another_hash_seed():
    code = (
        "import sys, numpy as np; from rag_rerank.embed.lexical import LexicalEmbedder;"
        f"sys.stdout.write(LexicalEmbedder().embed({TEXTS!r}).tobytes().hex())"
    )
    root = Path(__file__).resolve().parent.parent
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": str(root)},
        ).stdout
        for seed in ("1", "2")
    }
    assert outs == {LexicalEmbedder().embed(TEXTS).tobytes().hex()}


def test_case_punctuation_and_width_do_not_matter_but_words_do():
    emb = LexicalEmbedder()
    a, b, c = emb.embed(
        ["The IVF index, partitioned!", "the ivf   INDEX partitioned", "The HNSW graph, layered!"]
    )
    assert float(a @ b) > 0.999
    assert float(a @ c) < 0.3
    assert normalise_text("Ｆｕｌｌ-width") == " full width "


def test_copied_text_is_a_duplicate_and_independent_text_is_not():
    """One task of the clough-stevenson corpus (the full study is bench/duplicates.py)."""
    require(CLOUGH)
    import csv

    def read(name: str) -> str:
        raw = (CLOUGH / name).read_bytes()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("cp1252")

    with (CLOUGH / "file_information.csv").open(encoding="utf-8") as fh:
        rows = [
            r for r in csv.DictReader(fh) if r["Task"] == "a" and r["Category"] in ("cut", "light", "non")
        ]
    emb = LexicalEmbedder()
    vectors = emb.embed([read("orig_taska.txt")] + [read(r["File"]) for r in rows])
    sims = vectors[1:] @ vectors[0]
    copied = [s for r, s in zip(rows, sims, strict=True) if r["Category"] != "non"]
    independent = [s for r, s in zip(rows, sims, strict=True) if r["Category"] == "non"]
    assert len(copied) >= 5 and len(independent) >= 5
    assert min(copied) >= emb.duplicate_threshold > max(independent)


def test_get_embedder_specs():
    assert isinstance(get_embedder(None), LexicalEmbedder)
    assert isinstance(get_embedder(" Lexical "), LexicalEmbedder)
    assert get_embedder("lexical").name == "lexical"
    custom = LexicalEmbedder(dim=1024)
    assert get_embedder(custom) is custom
    assert isinstance(get_embedder("caller"), CallerVectors)
    with pytest.raises(InputError, match="unknown embedder 'word2vec'"):
        get_embedder("word2vec")
    with pytest.raises(InputError, match="embedder must be"):
        get_embedder(42)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="power of two"):
        LexicalEmbedder(dim=1000)
    with pytest.raises(InputError, match="needs an 'embedding'"):
        get_embedder("caller").embed(["x"])


def test_stopword_weight_removes_function_word_similarity():
    query = "How do I reset a forgotten PostgreSQL password?"
    texts = ["How do I plant tulip bulbs in the autumn?", "Reset the PostgreSQL password with ALTER USER."]
    plain = LexicalEmbedder().embed([query, *texts])
    damped = LexicalEmbedder(stopword_weight=0.1).embed([query, *texts])
    assert float(plain[1] @ plain[0]) > 0.15  # "how do i" alone makes them look related
    assert abs(float(damped[1] @ damped[0])) < 0.05
    assert float(damped[2] @ damped[0]) > 0.4  # the content words still match


def test_text_is_read_in_the_one_comparable_form() -> None:
    # A zero-width space or a soft hyphen inside a word (web and PDF text) is not a word break,
    # and an NFD accent is the composed one: the duplicate detector sees what the guard sees.
    assert normalise_text("zero\u200bwidth soft\u00adhyphen") == " zerowidth softhyphen "
    assert normalise_text("cafe\u0301") == normalise_text("café")
