"""Ray Data engine: the same records as the local engine, on a 2-CPU Ray that the module starts.

One local Ray per module (starting one costs seconds): 127.0.0.1 only, no dashboard, no usage
statistics, worker logs kept off the test output. Skipped when ray[data] is not installed, except
the test that the missing extra is named.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from rag_rerank import rerank
from rag_rerank.cli import main
from rag_rerank.errors import InputError, MissingDependencyError
from rag_rerank.skill import load_skill
from tests.support.fake_llm import FakeLLM
from tests.support.local_ray import start_local_ray
from tests.support.quoting_ranker import quoting_ranker

HAS_RAY = find_spec("ray") is not None and find_spec("pyarrow") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="needs rag-rerank[ray] (ray[data])")

QUERY = "When should I prefer IVF over HNSW for vector search?"
HAPPY = load_skill().example("happy-path").chunks
ROWS = [json.loads(r) for r in HAPPY.splitlines()]


@pytest.fixture(scope="module")
def local_ray(repo_root: Path) -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    start_local_ray(ray, repo_root)
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def _present(records: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """A struct column in Arrow has every field in every record: a ranked chunk without a
    `diversity_note` comes back with it as null whenever another one in the block has a note."""
    return None if records is None else [{k: v for k, v in r.items() if v is not None} for r in records]


def _requests(n: int) -> list[dict[str, Any]]:
    """n distinct requests: the card's happy path, rotated, with varied top_k and lambda."""
    out = []
    for i in range(n):
        k = i % len(ROWS)
        out.append(
            {
                "query_id": f"q{i}",
                "query": QUERY,
                "chunks": ROWS[k:] + ROWS[:k],
                "top_k": 1 + i % 4,
                "lambda": [0.3, 0.7, 1.0][i % 3],
            }
        )
    return out


BAD_LINES = [
    "{not json",
    json.dumps({"query": QUERY, "chunks": ROWS, "colour": "red"}),  # unknown key
    json.dumps({"query": "", "chunks": ROWS, "query_id": "empty"}),
    json.dumps({"query": QUERY, "chunks": ROWS, "top_k": "five", "query_id": 7}),  # types Arrow can't mix
    json.dumps({"query": QUERY, "chunks": [{"id": "x"}, {"id": "x", "text": 3}], "query_id": "bad-chunks"}),
    json.dumps([1, 2]),
]


def _input_file(path: Path, n: int = 24) -> Path:
    lines = [json.dumps(r) for r in _requests(n)]
    for i, bad in enumerate(BAD_LINES):
        lines.insert(3 + 4 * i, bad)
    lines.insert(10, "")  # a blank line is skipped by both engines
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _records(path: Path) -> list[dict[str, Any]]:
    """The output records without the one field that depends on timing."""
    out = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(raw)
        rec.get("meta", {}).pop("latency_ms", None)
        out.append(rec)
    return out


@needs_ray
def test_engine_ray_writes_what_the_local_engine_writes(local_ray: Any, tmp_path: Path) -> None:
    inp = _input_file(tmp_path / "in.jsonl")
    local, on_ray = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    code_local = main(["batch", "-i", str(inp), "-o", str(local), "--no-progress"])
    code_ray = main(
        ["batch", "-i", str(inp), "-o", str(on_ray), "--no-progress", "--engine", "ray", "--workers", "2"]
    )
    assert code_local == code_ray == 2  # some lines are bad input, none failed in the backend
    expected, got = _records(local), _records(on_ray)
    assert got == expected
    assert len(got) == 24 + len(BAD_LINES)
    assert [r["line"] for r in got] == sorted(r["line"] for r in got)  # input order
    errors = [r for r in got if "error" in r]
    assert len(errors) == len(BAD_LINES) and all(r["error"]["kind"] == "input" for r in errors)
    by_id = {r["query_id"]: r["error"]["message"] for r in errors if "query_id" in r}
    assert "query is empty" in by_id["empty"] and "top_k" in by_id[7]
    assert any("unknown key 'colour'" in r["error"]["message"] for r in errors)
    ok = [r for r in got if "result" in r]
    assert all(r["meta"]["backend"] == "local" for r in ok)
    assert all(len(r["result"]["ranked"]) <= 4 for r in ok)


@needs_ray
def test_engine_ray_resume_skips_finished_lines(local_ray: Any, tmp_path: Path) -> None:
    inp = _input_file(tmp_path / "in.jsonl", n=10)
    full = tmp_path / "full.jsonl"
    assert main(["batch", "-i", str(inp), "-o", str(full), "--no-progress"]) == 2
    lines = full.read_text(encoding="utf-8").splitlines(keepends=True)
    part = tmp_path / "part.jsonl"
    marker = json.loads(lines[2])
    marker.setdefault("meta", {})["notes"] = ["written before the crash"]  # must be kept, not redone
    part.write_text(  # six lines done, then a crash in the middle of the seventh
        "".join([*lines[:2], json.dumps(marker) + "\n", *lines[3:6]]) + lines[6][:25], encoding="utf-8"
    )
    code = main(["batch", "-i", str(inp), "-o", str(part), "--no-progress", "--resume", "--engine", "ray"])
    assert code == 2
    resumed = _records(part)
    expected = _records(full)
    expected[2].setdefault("meta", {})["notes"] = ["written before the crash"]
    assert resumed == expected


@needs_ray
def test_rerank_dataset_matches_rerank_and_isolates_bad_rows(local_ray: Any) -> None:
    from rag_rerank.integrations.ray import rerank_dataset

    rows = _requests(8)
    twins = [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]
    rows[3] = {"query_id": "bad", "query": QUERY, "chunks": twins}
    rows[5] = {"query_id": "meta", "query": QUERY, "chunks": [{**ROWS[0], "meta": {"page": 2}}, *ROWS[1:]]}
    ds = local_ray.data.from_items(rows)
    out = rerank_dataset(ds, concurrency=2, batch_size=3, per_actor_concurrency=2).take_all()
    by_id = {r["query_id"]: r for r in out}
    assert set(by_id) == {r["query_id"] for r in rows}
    for row in rows:
        got = by_id[row["query_id"]]
        assert got["query"] == row["query"]  # the input columns are kept
        if row["query_id"] == "bad":
            assert got["ranked"] is None and got["meta"] is None
            assert got["error"]["kind"] == "input" and "duplicate" in got["error"]["message"]
            with pytest.raises(InputError):
                rerank(row["query"], row["chunks"])
            continue
        want = rerank(row["query"], row["chunks"], row.get("top_k"), row.get("lambda"))
        assert got["error"] is None
        assert _present(got["ranked"]) == [r.to_dict() for r in want.ranked]
        assert _present(got["dropped"]) == [d.to_dict() for d in want.dropped]
        assert got["meta"]["backend"] == "local" and got["meta"]["embedder"] == want.meta.embedder


@needs_ray
def test_rerank_dataset_passes_row_options_to_rerank(local_ray: Any) -> None:
    """A key that is a per-request `rerank` keyword goes through; one it does not take is an error."""
    from rag_rerank.integrations.ray import rerank_dataset

    rows = [  # chunks as JSONL text this time: the records reach the guard exactly as written
        {"query_id": "a", "query": QUERY, "chunks": HAPPY, "layout": "lost_in_the_middle"},
        {"query_id": "b", "query": QUERY, "chunks": HAPPY, "no_such_option": 1},
    ]
    ds = local_ray.data.from_items(rows)
    out = {r["query_id"]: r for r in rerank_dataset(ds, concurrency=1).take_all()}
    want = rerank(QUERY, ROWS, layout="lost_in_the_middle")
    assert _present(out["a"]["ranked"]) == [r.to_dict() for r in want.ranked]
    assert out["b"]["error"]["kind"] == "input" and "no_such_option" in out["b"]["error"]["message"]


@needs_ray
def test_rerank_dataset_carries_passthrough_columns_to_the_output(local_ray: Any) -> None:
    """Regression: a dataset with a column that is not a rerank option (a label, a source) failed
    on every row ("unknown key"), so such columns could not travel with the rows to the output."""
    from rag_rerank.integrations.ray import rerank_dataset

    rows = [{"query_id": "a", "query": QUERY, "chunks": HAPPY, "source": "faq", "gold": ["c3"]},
            {"query_id": "b", "query": QUERY, "chunks": HAPPY, "source": "web", "gold": ["c2"]}]
    ds = local_ray.data.from_items(rows)
    out = {r["query_id"]: r for r in rerank_dataset(ds, concurrency=1).take_all()}
    assert "passthrough_columns=[...]" in out["a"]["error"]["message"]  # the way out, named
    out = {r["query_id"]: r for r in rerank_dataset(ds, concurrency=1,
                                                    passthrough_columns=["source", "gold"]).take_all()}
    want = rerank(QUERY, ROWS)
    for row in rows:
        got = out[row["query_id"]]
        assert got["error"] is None and (got["source"], list(got["gold"])) == (row["source"], row["gold"])
        assert _present(got["ranked"]) == [r.to_dict() for r in want.ranked]
    for bad in ("source", ["query"], [3]):
        with pytest.raises(InputError, match="passthrough_columns"):
            rerank_dataset(ds, concurrency=1, passthrough_columns=bad)


@needs_ray
def test_one_actor_builds_its_backend_and_embedder_once() -> None:
    """The actor's callable, called in this process on two batches: the same backend and embedder
    objects serve both (a model would load once per actor), and the rows are rerank()'s."""
    import pyarrow as pa

    from rag_rerank.integrations.ray import RerankActor

    actor = RerankActor({"backend": "local", "embedder": "lexical"}, per_actor_concurrency=2, wire=False)
    backend, embedder = actor.reranker.backend, actor.reranker.embedder
    for rows in (_requests(3), _requests(5)[3:]):
        out = actor(pa.Table.from_pylist(rows)).to_pylist()
        for row, got in zip(rows, out, strict=True):
            want = rerank(row["query"], row["chunks"], row["top_k"], row["lambda"])
            assert _present(got["ranked"]) == [r.to_dict() for r in want.ranked] and got["error"] is None
    assert actor.reranker.backend is backend and actor.reranker.embedder is embedder


@needs_ray
def test_rerank_dataset_with_an_llm_backend_over_several_batches(local_ray: Any) -> None:
    """The openai SDK on one actor, three batches on the actor's one event loop, against 127.0.0.1."""
    from rag_rerank.integrations.ray import rerank_dataset

    with FakeLLM(handler=quoting_ranker()) as srv:
        ds = local_ray.data.from_items(_requests(6))
        out = rerank_dataset(
            ds, concurrency=1, batch_size=2, backend="openai", base_url=srv.openai_url, api_key="k", model="m"
        ).take_all()
        assert len(srv.requests) == 6
    assert all(r["error"] is None and r["meta"]["backend"] == "openai" for r in out)
    assert all(1 <= len(r["ranked"]) <= r["top_k"] for r in out)


@needs_ray
def test_rerank_dataset_refuses_bad_settings_before_any_actor_starts(local_ray: Any) -> None:
    from rag_rerank.integrations.ray import rerank_dataset

    ds = local_ray.data.from_items(_requests(1))
    with pytest.raises(InputError) as err:
        rerank_dataset(ds, concurrency=0, batch_size=0, backend="nope", top_kk=3)
    text = str(err.value)
    for word in ("concurrency", "batch_size", "nope", "top_kk"):
        assert word in text
    import threading

    from rag_rerank import make_backend
    from rag_rerank.integrations.ray import _check

    class LockedEmbedder:  # holds a lock: cannot travel to the actors
        name, duplicate_threshold = "locked", 0.5

        def __init__(self) -> None:
            self.lock = threading.Lock()

    with pytest.raises(InputError, match="by name"):
        rerank_dataset(ds, concurrency=1, embedder=LockedEmbedder())
    # A backend instance pickles without its connections: each actor gets a copy with its own client.
    live = make_backend("openai", base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    live.close()
    assert _check(1, 8, 4, {"backend": live}) == frozenset()
    # A model the local backend would ignore: refused here, not by every actor on its first batch.
    with pytest.raises(InputError, match="the local backend takes no model"):
        rerank_dataset(ds, concurrency=1, model="gpt-4o-mini")


def test_cli_ray_options_need_the_ray_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp = _input_file(tmp_path / "in.jsonl", n=1)
    assert main(["batch", "-i", str(inp), "--ray-address", "127.0.0.1:1"]) == 2
    assert "--engine ray" in capsys.readouterr().err
    assert main(["batch", "-i", str(inp), "--engine", "ray", "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from rag_rerank.integrations import ray as rr

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if not installed
    monkeypatch.setitem(sys.modules, "ray.data", None)
    with pytest.raises(MissingDependencyError) as err:
        rr.rerank_dataset(object(), concurrency=1)  # type: ignore[arg-type]
    assert "rag-rerank[ray]" in str(err.value)
    inp = _input_file(tmp_path / "in.jsonl", n=2)
    assert main(["batch", "-i", str(inp), "--engine", "ray", "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "rag-rerank[ray]" in capsys.readouterr().err


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port on 127.0.0.1 held bound but not listening for the test: a connection is refused."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


def _cli(repo_root: Path, args: list[str], env: dict[str, str]) -> Any:
    import subprocess

    # The timeout only guards against a hang (Ray's own retries ran for minutes); no timing is asserted.
    return subprocess.run([sys.executable, "-m", "rag_rerank.cli", *args], cwd=repo_root, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


@needs_ray
@pytest.mark.parametrize("form", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}", "auto"])
def test_cli_ray_address_where_nothing_listens_is_exit_2_naming_it(
    form: str, dead_port: int, repo_root: Path, tmp_path: Path
) -> None:
    inp = _input_file(tmp_path / "in.jsonl", n=2)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root), *filter(None, [env.get("PYTHONPATH")])])
    if form == "auto":  # `auto` is RAY_ADDRESS when set, as in Ray
        env["RAY_ADDRESS"] = f"127.0.0.1:{dead_port}"
    address = form.format(port=dead_port)
    out = tmp_path / "out.jsonl"
    proc = _cli(repo_root, ["batch", "-i", str(inp), "-o", str(out), "--no-progress", "--engine", "ray",
                            "--ray-address", address], env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--ray-address" in lines[0], proc.stderr
    assert f"127.0.0.1:{dead_port}" in lines[0] and "connection refused" in lines[0]
    assert not out.exists() or out.read_text(encoding="utf-8") == ""


@needs_ray
def test_cli_ray_address_from_ray_address_env_is_checked_too(dead_port: int, repo_root: Path,
                                                             tmp_path: Path) -> None:
    inp = _input_file(tmp_path / "in.jsonl", n=1)
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{dead_port}"}
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = _cli(repo_root, ["batch", "-i", str(inp), "--no-progress", "--engine", "ray"], env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"127.0.0.1:{dead_port}" in proc.stderr and "RAY_ADDRESS" in proc.stderr


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.0.0.5:6379", ("10.0.0.5", 6379)),
        ("ray://head.example:10002", ("head.example", 10002)),
        ("ray://head.example", ("head.example", 10001)),
        ("[::1]:6379", ("::1", 6379)),
        ("anyscale://cluster", None),  # another scheme: Ray's to accept or refuse
    ],
)
def test_ray_address_endpoint(address: str, expected: Any) -> None:
    from rag_rerank.integrations.ray import _endpoint

    assert _endpoint(address) == expected


@pytest.mark.parametrize("address", ["head", "head:abc", "head:0", ":6379", "::1:6379"])
def test_malformed_ray_addresses_are_named(address: str) -> None:
    from rag_rerank.integrations.ray import _check_address

    with pytest.raises(InputError) as err:
        _check_address(address, "")
    assert err.value.violations[0].path == "--ray-address" and address in str(err.value)


def test_an_address_that_accepts_connections_passes_the_check() -> None:
    import socket

    from rag_rerank.integrations.ray import _check_address, _unreachable

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]
        assert _unreachable("127.0.0.1", port) is None
        _check_address(f"127.0.0.1:{port}", "")
        _check_address(f"ray://127.0.0.1:{port}", "")


@needs_ray
def test_joining_a_token_cluster_by_address_without_ray_auth_mode_says_what_to_set(
    local_ray: Any, repo_root: Path, tmp_path: Path
) -> None:
    """Regression: `ray start --head` turns on token authentication, and Ray sends the token to an
    address given explicitly only with RAY_AUTH_MODE=token; without it the run ended, after 20 s of
    warnings, with a bare "Failed to connect to Ray cluster at ...". The message now names the
    variable, and with it set the same command runs."""
    address = local_ray.get_runtime_context().gcs_address
    inp = _input_file(tmp_path / "in.jsonl", n=2)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root), *filter(None, [env.get("PYTHONPATH")])])
    args = ["batch", "-i", str(inp), "-o", str(tmp_path / "out.jsonl"), "--no-progress", "--engine", "ray",
            "--ray-address", address]
    proc = _cli(repo_root, args, env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "--ray-address" in last and "RAY_AUTH_MODE=token" in last
    proc = _cli(repo_root, args, {**env, "RAY_AUTH_MODE": "token"})
    assert proc.returncode == 2, proc.stderr  # the file's bad lines; every good one ran on the cluster
    assert len((tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()) == 2 + len(BAD_LINES)


def test_the_token_advice_is_given_only_when_there_is_a_cluster_and_no_auth_mode() -> None:
    """`--ray-address auto` with no cluster anywhere fails for that reason alone (Ray says so): the
    RAY_AUTH_MODE advice would send the user looking for a token problem."""
    from rag_rerank.integrations.ray import _auth_advice

    assert "RAY_AUTH_MODE=token" in _auth_advice({}, "127.0.0.1:6379")
    assert _auth_advice({}, None) == ""
    assert _auth_advice({"RAY_AUTH_MODE": "token"}, "127.0.0.1:6379") == ""
