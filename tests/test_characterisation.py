"""Characterisation: the full results of every path through the pipeline, recorded once and compared
on every run, so a restructuring that changes behaviour anywhere is caught.

The paths: sync and async, in windows or not, with `fallback="local"` or not, and a backend that
answers, a backend that fails, an embedder that fails; plus the `rag-rerank batch` output file
(local engine and Ray), and `rag-rerank golden`'s report. Each result is recorded whole: the card's
object, `meta` (latencies aside), or the exception's type and message. Server ports are masked.

Numbers are compared within 2e-3 (scores are written with three decimals, and a float32 sum on
another CPU may round the last one the other way); everything else exactly.

To record anew after an intended change of behaviour: `RAG_RERANK_RECORD=1 pytest
tests/test_characterisation.py`, then read the diff of `golden/characterisation/` before committing.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rag_rerank import RetryPolicy, arerank, rerank
from rag_rerank.cli import main
from rag_rerank.embed import get_embedder
from rag_rerank.skill import load_skill
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply
from tests.support.quoting_ranker import answer_for

RECORDED = Path(__file__).resolve().parent.parent / "golden" / "characterisation"
RECORD = os.environ.get("RAG_RERANK_RECORD") == "1"
TOLERANCE = 2e-3
_PORT = re.compile(r"127\.0\.0\.1:\d+")
_ROOT = str(RECORDED.parent.parent)
_NUMBER = re.compile(r"-?\d+\.\d+")

HAPPY = load_skill().example("happy-path")
QUERY = HAPPY.query
TOPICS = ["IVF partitions vectors into Voronoi cells and probes a few of them per query.",
          "HNSW builds a layered proximity graph; memory grows with the number of links.",
          "Product quantisation compresses vectors into short codes for a smaller index.",
          "Sourdough needs a lively starter and a long, cool rise.",
          "A vector index trades recall for speed; IVF needs training on a sample first.",
          "The Eiffel Tower was finished in 1889.",
          "FAISS offers both IVF and HNSW indexes behind one API.",
          "Prefer IVF over HNSW when index memory is constrained and recall can dip a little."]
# 24 chunks for windows of 10: three windows and a final pass.
MANY = [{"id": f"w{i:02d}", "text": f"{TOPICS[i % len(TOPICS)]} (note {i})"} for i in range(24)]


class Server:
    """The fake LLM in one of three moods: answers, fails (401: fatal, no retry), or answers chat
    but fails every embeddings call."""

    def __init__(self) -> None:
        self.mood = "ok"
        self.llm = FakeLLM(handler=self.handle)

    def handle(self, req: RecordedRequest) -> Reply:
        if req.api == "embeddings":
            if self.mood == "embedder-fails":
                return Reply.openai_error(500, "embeddings are down", type_="server_error")
            from tests.support.fake_llm import hashed_embedding

            inputs = req.body.get("input", []) if isinstance(req.body, dict) else []
            inputs = [inputs] if isinstance(inputs, str) else inputs
            data = [{"object": "embedding", "index": i, "embedding": hashed_embedding(str(t))}
                    for i, t in enumerate(inputs)]
            return Reply(200, {"object": "list", "data": data, "model": "fake-embed",
                               "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}})
        if self.mood == "backend-fails":
            return Reply.openai_error(401, "invalid api key", type_="authentication_error")
        return Reply.openai_text(json.dumps(answer_for(req.prompt)),
                                 usage={"prompt_tokens": len(req.prompt) // 4, "completion_tokens": 50,
                                        "total_tokens": len(req.prompt) // 4 + 50})


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server()
    with srv.llm:
        yield srv


async def _no_wait(_: float) -> None:
    return None


POLICY = RetryPolicy(max_attempts=3, jitter_s=0.0, sleep=lambda _: None, asleep=_no_wait)


def _scenarios() -> list[tuple[str, str, bool, str | None, str]]:
    """(name, backend kind, windowed, fallback, mood) for every combination worth recording."""
    out = []
    for kind, mood in (("local", "ok"), ("openai", "ok"), ("openai", "backend-fails"),
                       ("local", "embedder-fails"), ("openai", "embedder-fails")):
        for windowed in (False, True):
            for fallback in (None, "local"):
                if mood == "ok" and fallback is not None:
                    continue  # nothing to fall back from
                name = f"{kind}-{mood}-{'windows' if windowed else 'one-call'}-fallback-{fallback}"
                out.append((name, kind, windowed, fallback, mood))
    return out


def _options(server: Server, kind: str, mood: str, fallback: str | None) -> dict[str, Any]:
    opts: dict[str, Any] = {"fallback": fallback, "policy": POLICY}
    if kind == "openai":
        opts.update(backend="openai", model="fake-gpt", base_url=server.llm.openai_url,
                    api_key="sk-char-0000")
    if mood == "embedder-fails":
        opts["embedder"] = get_embedder("openai:fake-embed", base_url=server.llm.openai_url,
                                        api_key="sk-char-0000")
    return opts


def _outcome(call: Callable[[], Any]) -> dict[str, Any]:
    try:
        result = call()
    except Exception as exc:
        return {"error": {"type": type(exc).__name__, "message": str(exc)}}
    meta = result.meta.to_dict()
    meta.pop("latency_ms", None)
    for window in meta.get("windows", []):
        window.pop("latency_ms", None)
    return {"result": result.to_dict(), "meta": meta}


def _masked(value: Any) -> Any:
    """Ports and the checkout's path masked, recursively (both differ from machine to machine)."""
    if isinstance(value, str):
        return _PORT.sub("127.0.0.1:PORT", value).replace(_ROOT, "<ROOT>")
    if isinstance(value, list):
        return [_masked(v) for v in value]
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    return value


def _same(got: Any, want: Any, where: str = "$") -> list[str]:
    """Where `got` differs from `want`: numbers (also inside strings) within TOLERANCE, the rest exactly."""
    if isinstance(want, bool) or want is None:
        return [] if got == want else [f"{where}: {got!r} != {want!r}"]
    if isinstance(want, (int, float)) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return [] if abs(got - want) <= TOLERANCE else [f"{where}: {got!r} != {want!r}"]
    if isinstance(want, str) and isinstance(got, str):
        if _NUMBER.sub("#", got) != _NUMBER.sub("#", want):
            return [f"{where}: {got!r} != {want!r}"]
        pairs = zip(_NUMBER.findall(got), _NUMBER.findall(want), strict=True)
        return [] if all(abs(float(a) - float(b)) <= TOLERANCE for a, b in pairs) else [
            f"{where}: {got!r} != {want!r}"]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items != {len(want)}"]
        pairs = enumerate(zip(got, want, strict=True))
        return [d for i, (g, w) in pairs for d in _same(g, w, f"{where}[{i}]")]
    if isinstance(want, dict) and isinstance(got, dict):
        if got.keys() != want.keys():
            return [f"{where}: keys {sorted(got)} != {sorted(want)}"]
        return [d for k in want for d in _same(got[k], want[k], f"{where}.{k}")]
    return [] if got == want else [f"{where}: {got!r} != {want!r}"]


def _check(name: str, got: Any) -> None:
    path = RECORDED / f"{name}.json"
    got = _masked(json.loads(json.dumps(got, ensure_ascii=False)))
    if RECORD:
        RECORDED.mkdir(parents=True, exist_ok=True)
        text = json.dumps(got, ensure_ascii=False, indent=1, sort_keys=True)
        path.write_text(text + "\n", encoding="utf-8")
        return
    assert path.exists(), f"{path} is not recorded: run with RAG_RERANK_RECORD=1 once"
    want = json.loads(path.read_text(encoding="utf-8"))
    differences = _same(got, want)
    assert not differences, f"{name} changed:\n" + "\n".join(differences[:20])


@pytest.mark.parametrize(("name", "kind", "windowed", "fallback", "mood"), _scenarios(),
                         ids=[s[0] for s in _scenarios()])
def test_rerank_and_arerank_results_are_unchanged(server: Server, name: str, kind: str, windowed: bool,
                                                  fallback: str | None, mood: str) -> None:
    server.mood = mood
    try:
        opts = _options(server, kind, mood, fallback)
        chunks: Any = MANY if windowed else HAPPY.chunks
        extra = {"window_size": 10} if windowed else {}
        sync = _outcome(lambda: rerank(QUERY, chunks, 3, 0.7, **opts, **extra))
        async_ = _outcome(lambda: asyncio.run(arerank(QUERY, chunks, 3, 0.7, **opts, **extra)))
    finally:
        server.mood = "ok"
    assert _same(_masked(async_), _masked(sync)) == [], "arerank and rerank differ"
    _check(name, sync)


def _batch_input(tmp_path: Path) -> Path:
    rows = [json.loads(line) for line in HAPPY.chunks.splitlines() if line.strip()]
    lines = [{"query": QUERY, "chunks": rows, "top_k": 3, "query_id": "q1"},
             {"query": "Which index suits a small memory budget?", "chunks": rows[::-1], "top_k": 2},
             {"query": "", "chunks": rows},  # bad input: an error record, the others still run
             {"query": QUERY, "chunks": MANY, "top_k": 4, "window_size": 10, "query_id": "windows"}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n", encoding="utf-8")
    return path


def _batch_records(path: Path) -> list[Any]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        meta = rec.get("meta")
        if isinstance(meta, dict):
            meta.pop("latency_ms", None)
            for window in meta.get("windows", []):
                window.pop("latency_ms", None)
        out.append(rec)
    return out


def test_batch_output_file_is_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.jsonl"
    code = main(["batch", "-i", str(_batch_input(tmp_path)), "-o", str(out), "--no-progress"])
    err = capsys.readouterr().err
    _check("batch-local", {"exit": code, "stderr": err, "records": _batch_records(out)})


def test_golden_report_is_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["golden"])
    captured = capsys.readouterr()
    _check("golden", {"exit": code, "stdout": captured.out, "stderr": captured.err})


@pytest.fixture(scope="module")
def local_ray(repo_root: Path) -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    paths = [str(repo_root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", configure_logging=False)
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def test_ray_batch_output_file_is_unchanged(local_ray: Any, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.jsonl"
    code = main(["batch", "-i", str(_batch_input(tmp_path)), "-o", str(out), "--no-progress",
                 "--engine", "ray", "--workers", "1"])
    err = capsys.readouterr().err
    _check("batch-ray", {"exit": code, "stderr": err, "records": _batch_records(out)})
