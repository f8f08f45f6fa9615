"""Batch reranking on Ray Data: the same requests and records as `rag-rerank batch`, on many workers.

`rerank_dataset(ds, concurrency=N, **rerank_options)` maps a dataset of batch-file rows
`{query_id?, query, chunks, top_k?, lambda?, ...}` through `N` actors (`map_batches` with a
callable class). Each actor holds one `Reranker` session, so a model loads once per worker and an
LLM backend keeps one connection pool per worker, and runs each batch of rows through
`Reranker.arerank_many` (the local engine's per-request logic: bounded async concurrency, failures
isolated per request) with `per_actor_concurrency` requests in flight. Requests in flight across
the cluster = actors x `per_actor_concurrency`: that is the number to hold under a provider's
rate limit.

Output rows keep the input columns and add `ranked`, `dropped` (the records of batch output),
`meta`, and `error` (`{kind, message, ...}` exactly as in batch output); a column that does not
apply to a row is null (a Ray dataset is a table).

`run_lines` is the `rag-rerank batch --engine ray` engine: the CLI keeps reading, resuming and
writing in input order (`cli/batch.py`, in the format of `batchfile.py`); requests travel to the
actors as JSON text, so every value reaches the guards exactly as the local engine would see it
(Arrow would unify the records' types and give every record every key). Before joining
`--ray-address` it opens a TCP connection there with a few seconds' budget: Ray's own retries on an
address nothing answers on last minutes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..backends.factory import BACKENDS, unused_option_violations
from ..batchfile import Line, Outcome, record
from ..errors import InputError, MissingDependencyError, Violation
from ..options import ALL_OPTIONS, UNKNOWN_KEY_HINT, split_options
from ..redaction import secrets_of
from ..session import Reranker

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    import ray.data

# Columns of the CLI's wire rows: the index in the run, the input line number, the request as JSON.
_INDEX, _LINE, _REQUEST, _RECORD = "_rr_index", "_rr_line", "_rr_request", "_rr_record"
# Columns rerank_dataset adds; an input that already has them (an earlier output) gets them replaced.
OUTPUT_COLUMNS = ("ranked", "dropped", "meta", "error")
DEFAULT_BATCH_SIZE = 16
DEFAULT_PER_ACTOR_CONCURRENCY = 4
# How long `--ray-address` gets to accept a TCP connection (name lookup included) before the run
# stops: Ray itself retries an unreachable address for minutes, which looks like a hang.
ADDRESS_CHECK_TIMEOUT_S = 5.0
RAY_CLIENT_PORT = 10001  # Ray Client's default port (ray://HOST)


def _require_ray() -> Any:
    try:
        import ray
        import ray.data  # the Data library is a separate part of the ray[data] extra
    except ImportError:
        feature = "reranking on Ray (rerank_dataset, --engine ray)"
        raise MissingDependencyError(feature, "ray", "ray[data]") from None
    return ray


def _drop_nulls(value: Any) -> Any:
    """A mapping without its null-valued keys, recursively: Arrow gives every record of a column
    every key any record has (missing ones as null), which is not what the caller wrote."""
    if isinstance(value, Mapping):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    return value


def _request_from_row(row: Mapping[str, Any], passthrough: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A batch request from a dataset row: null columns are absent keys, `passthrough` columns
    stay out of it, and each chunk record loses the null keys Arrow added (give `chunks` as JSONL
    text to keep records byte-exact)."""
    item = {k: v for k, v in row.items()
            if v is not None and k not in OUTPUT_COLUMNS and k not in passthrough}
    chunks = item.get("chunks")
    if isinstance(chunks, list):
        item["chunks"] = [_drop_nulls(c) if isinstance(c, Mapping) else c for c in chunks]
    return item


class RerankActor:
    """One per actor: its `Reranker` session is built here, once, and reused for every batch.

    One event loop lives as long as the actor, so an async HTTP client's connection pool (bound to
    the loop it was first used on) survives from batch to batch."""

    def __init__(self, options: Mapping[str, Any], per_actor_concurrency: int, wire: bool,
                 passthrough: frozenset[str] = frozenset(), scores: bool = False) -> None:
        session, request = split_options(options)
        self.reranker = Reranker(**session, **request)
        self.passthrough = passthrough
        self.scores = scores
        self.concurrency = per_actor_concurrency
        self.wire = wire
        self.secrets = secrets_of(options.get("api_key"), urls=[options.get("base_url")])
        self.loop = asyncio.new_event_loop()

    def _outcomes(self, items: Sequence[Mapping[str, Any]]) -> list[Outcome]:
        run = self.reranker.arerank_many(items, concurrency=self.concurrency)
        return list(self.loop.run_until_complete(run))

    def __call__(self, batch: pa.Table) -> pa.Table:
        import pyarrow as pa

        rows = batch.to_pylist()
        if self.wire:
            items = [json.loads(r[_REQUEST]) for r in rows]
            recs = [
                record(Line(r[_LINE], it.get("query_id", it.get("qid")), it), out, self.secrets, self.scores)
                for r, it, out in zip(rows, items, self._outcomes(items), strict=True)
            ]
            return pa.table(
                {
                    _INDEX: batch.column(_INDEX),
                    _RECORD: pa.array([json.dumps(rec, ensure_ascii=False) for rec in recs], pa.string()),
                }
            )
        items = [_request_from_row(r, self.passthrough) for r in rows]
        hint = UNKNOWN_KEY_HINT.set(_PASSTHROUGH_HINT)
        try:
            outcomes = self._outcomes(items)
        finally:
            UNKNOWN_KEY_HINT.reset(hint)
        recs = [record(Line(0, None, it), o, self.secrets) for it, o in zip(items, outcomes, strict=True)]
        table = batch.drop_columns([c for c in OUTPUT_COLUMNS if c in batch.column_names])
        columns = {
            "ranked": [rec["result"]["ranked"] if "result" in rec else None for rec in recs],
            "dropped": [rec["result"]["dropped"] if "result" in rec else None for rec in recs],
            "meta": [rec.get("meta") for rec in recs],
            "error": [rec.get("error") for rec in recs],
        }
        for name, values in columns.items():
            table = table.append_column(name, pa.array(values))
        return table


_PASSTHROUGH_HINT = ("; a column to keep in the output without sending it to rerank: "
                     "rerank_dataset(..., passthrough_columns=[...])")


def _passthrough(columns: Any) -> tuple[frozenset[str], list[Violation]]:
    """The `passthrough_columns` as a set, or why they cannot be: names of columns, and not the
    request's own (a passthrough `query` would leave every row without one)."""
    if columns is None:
        return frozenset(), []
    names = [columns] if isinstance(columns, str) else columns
    try:
        names = list(names)
    except TypeError:
        names = [columns]
    bad = [n for n in names if not isinstance(n, str) or not n]
    own = sorted(n for n in names if n in ("query", "chunks"))
    problems = []
    if isinstance(columns, str) or bad:
        problems.append(Violation(path="passthrough_columns", value=columns, message="passthrough_columns "
                                  f"must be a list of column names, got {columns!r}"))
    if own:
        problems.append(Violation(path="passthrough_columns", value=own, message=f"{own} are the request's "
                                  "own columns and are always read; list only columns to carry through"))
    return frozenset(n for n in names if isinstance(n, str)), problems


def _check(concurrency: Any, batch_size: Any, per_actor_concurrency: Any, options: Mapping[str, Any],
           passthrough: Any = None) -> frozenset[str]:
    """The mistakes that would otherwise fail inside every actor's constructor, far from the call;
    with none, the passthrough column names."""
    keep, problems = _passthrough(passthrough)

    def positive_int(name: str, value: Any) -> bool:
        return not isinstance(value, bool) and isinstance(value, int) and value >= 1

    pool = concurrency if isinstance(concurrency, tuple) else (concurrency,)
    if not (1 <= len(pool) <= 2 and all(positive_int("concurrency", n) for n in pool)):
        problems.append(
            Violation(
                path="concurrency",
                value=concurrency,
                message="concurrency (the number of actors) must be an integer of at least 1 "
                f"or a (min, max) pair of them, got {concurrency!r}",
            )
        )
    for name, value in (("batch_size", batch_size), ("per_actor_concurrency", per_actor_concurrency)):
        if not positive_int(name, value):
            problems.append(
                Violation(path=name, value=value, message=f"must be an integer of at least 1, got {value!r}")
            )
    keywords = [k for k in ALL_OPTIONS if k not in ("top_k", "lambda_")]  # rerank()'s keyword-only options
    for key in options:
        if key not in keywords:
            problems.append(Violation(path=key, message=f"unknown rerank option {key!r} "
                                      f"(options: {', '.join(keywords)})"))
    backend = options.get("backend", "local")
    if isinstance(backend, str) and backend not in BACKENDS:
        problems.append(
            Violation(
                path="backend",
                value=backend,
                message=f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}",
            )
        )
    elif isinstance(backend, str):  # checked here, not in every actor on its first batch
        problems.extend(unused_option_violations(backend, model=options.get("model"),
                                                 base_url=options.get("base_url"),
                                                 api_key=options.get("api_key")))
    if not problems:
        from ray import cloudpickle

        try:  # the options travel to every actor; an object holding a live client cannot
            cloudpickle.dumps(dict(options))
        except Exception as exc:
            msg = (
                f"the rerank options must be picklable to reach the actors ({type(exc).__name__}: {exc}); "
                "pass the backend and embedder by name (backend='openai', base_url=...): "
                "each actor builds its own"
            )
            problems.append(Violation(path="rerank_options", message=msg))
    if problems:
        raise InputError(problems)
    return keep


def _map(
    ds: ray.data.Dataset,
    *,
    concurrency: int | tuple[int, int],
    batch_size: int,
    per_actor_concurrency: int,
    num_cpus: float,
    num_gpus: float,
    wire: bool,
    options: Mapping[str, Any],
    passthrough_columns: Any = None,
    scores: bool = False,
) -> ray.data.Dataset:
    ray = _require_ray()
    keep = _check(concurrency, batch_size, per_actor_concurrency, options, passthrough_columns)
    size = concurrency if isinstance(concurrency, tuple) else (concurrency, concurrency)
    opts, per_actor = dict(options), per_actor_concurrency

    class RagRerank(RerankActor):  # the settings travel with the class, not as object-store arguments
        def __init__(self) -> None:
            super().__init__(opts, per_actor, wire, keep, scores)

    RagRerank.__qualname__ = "RagRerank"
    return ds.map_batches(
        RagRerank,
        batch_size=batch_size,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(min_size=size[0], max_size=size[-1]),
        num_cpus=num_cpus,
        num_gpus=num_gpus,
    )


def rerank_dataset(
    ds: ray.data.Dataset,
    *,
    concurrency: int | tuple[int, int],
    batch_size: int = DEFAULT_BATCH_SIZE,
    per_actor_concurrency: int = DEFAULT_PER_ACTOR_CONCURRENCY,
    num_cpus: float = 1,
    num_gpus: float = 0,
    passthrough_columns: Sequence[str] | None = None,
    **rerank_options: Any,
) -> ray.data.Dataset:
    """Rerank every row of `ds` (`{query_id?, query, chunks, top_k?, lambda?, ...}`) on Ray actors.

    `concurrency` is the number of actors (or a `(min, max)` pair to autoscale), each holding one
    backend and one embedder built from `rerank_options` (`backend`, `model`, `base_url`,
    `embedder`, `layout`, ... as for `rerank`) and running `per_actor_concurrency` requests at
    once on `batch_size` rows at a time. `num_cpus` / `num_gpus` are each actor's resources: with
    a model on GPUs, `num_gpus=1` puts one model on each GPU; an I/O-bound LLM backend can take a
    fraction of a CPU. Any other key of a row is passed to `rerank` as a keyword (per-request options),
    except the `passthrough_columns` (ids, labels, a source), which only travel to the output.

    Returns a lazy dataset: the input columns plus `ranked`, `dropped`, `meta` and `error` (null
    where it does not apply). A bad row never stops the job: it gets an `error` record with the
    same kind and message as `rag-rerank batch` would write. Raises `InputError` at once for bad
    settings, and `MissingDependencyError` without `rag-rerank[ray]`.
    """
    return _map(
        ds,
        concurrency=concurrency,
        batch_size=batch_size,
        per_actor_concurrency=per_actor_concurrency,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        wire=False,
        options=rerank_options,
        passthrough_columns=passthrough_columns,
    )


# ------------------------------------------------------------------------------ the CLI's engine


def _endpoint(address: str) -> tuple[str, int] | str | None:
    """The (host, port) a Ray address connects to first, a message when it cannot be one, or None
    when it is not ours to check (another `scheme://`, which Ray itself accepts or refuses at once).

    A GCS address is HOST:PORT (`ray start --head` listens on 6379); `ray://HOST[:PORT]` is Ray
    Client (port 10001 unless given); `[::1]:6379` is an IPv6 host."""
    default_port: int | None = None
    if "://" in address:
        scheme, _, address = address.partition("://")
        if scheme != "ray":
            return None
        address = address.split("/", 1)[0]
        default_port = RAY_CLIENT_PORT
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
    elif address.count(":") == 1:
        host, _, port_text = address.partition(":")
    else:
        host, port_text = address, ""
    if not host:
        return "no host; expected HOST:PORT (a GCS address, 6379 by default) or ray://HOST[:PORT]"
    if not port_text:
        if default_port is None:
            return "no port; expected HOST:PORT (a GCS address, 6379 by default) or ray://HOST[:PORT]"
        return host, default_port
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        return f"the port {port_text!r} is not a number from 1 to 65535"
    return host, int(port_text)


def _unreachable(host: str, port: int, timeout: float = ADDRESS_CHECK_TIMEOUT_S) -> str | None:
    """Why nothing at host:port accepts a TCP connection within `timeout` (None when something does).

    The attempt runs in a daemon thread so that a name lookup that never answers (getaddrinfo
    has no timeout of its own) cannot hold up the run or its exit."""
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=attempt, name="rag-rerank-ray-address", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"no answer within {timeout:g} s"
    exc = outcome[0]
    if exc is None:
        return None
    if isinstance(exc, socket.gaierror):
        return f"the host name {host!r} does not resolve ({exc.strerror or exc})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused: nothing listens on that port"
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s"
    return " ".join(str(exc).split())


def _resolve_auto(address: str) -> str | None:
    """What Ray will join for `auto`: RAY_ADDRESS when set, else the cluster recorded by the last
    `ray start` on this machine (None: Ray then looks for a running local cluster and says at once
    when there is none)."""
    if address != "auto":
        return address
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    try:  # Ray's own reader of its cluster file; private, so any failure just skips the check
        from ray._private.services import find_bootstrap_address

        found = find_bootstrap_address(None)
    except Exception:
        return None
    return found if isinstance(found, str) and found else None


def _check_address(address: str, source: str) -> None:
    """Refuse an address nothing answers on within seconds, naming it: Ray would retry for minutes."""
    target = _resolve_auto(address)
    if target is None or target == "local":
        return
    endpoint = _endpoint(target)
    if endpoint is None:
        return
    if isinstance(endpoint, str):
        reason = endpoint
    else:
        reason = _unreachable(*endpoint)
        if reason is None:
            return
    shown = target if target == address else f"{target} (what {address!r} resolves to)"
    msg = f"cannot reach the Ray cluster at {shown}{source}: {reason}"
    raise InputError([Violation(path="--ray-address", value=address, message=msg)])


def _connect(ray: Any, address: str | None) -> bool:
    """Join `address` (or RAY_ADDRESS), else start a local Ray with this machine's cores.
    True when this call started Ray (so the caller shuts it down)."""
    if ray.is_initialized():
        return False
    source = "" if address else " (from RAY_ADDRESS)"
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        _check_address(address, source)
    # A local Ray reports usage statistics over the network unless told not to; a reranker that
    # is offline by default keeps it off unless the user has chosen otherwise.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    settings: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address is None:
        settings.update(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False)
    else:
        settings.update(address=address)
    try:
        ray.init(**settings)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        msg = f"cannot start or join {where}: {' '.join(str(exc).split())}"
        if address is not None and isinstance(exc, ConnectionError):
            msg += _auth_advice(os.environ, _resolve_auto(address))
        raise InputError([Violation(path="--ray-address", message=msg)]) from None
    return True


def _auth_advice(env: Mapping[str, str], target: str | None) -> str:
    """Why a cluster that accepts TCP connections may still refuse to be joined. `ray start --head`
    turns on token authentication, and Ray sends the token to an address given explicitly (an
    argument or RAY_ADDRESS) only when RAY_AUTH_MODE=token says so; without it the join fails
    after about 20 s of "InvalidAuthToken" warnings and a bare "Failed to connect". Nothing to
    add when `auto` found no cluster at all (`target` None): Ray's own message says so."""
    if env.get("RAY_AUTH_MODE") or target is None:
        return ""
    return ("; if the cluster uses token authentication (what `ray start --head` turns on), set "
            "RAY_AUTH_MODE=token, with the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN")


def run_lines(
    lines: Sequence[Line],
    *,
    on_done: Callable[[int, Outcome], None],
    on_record: Callable[[int, dict[str, Any]], None],
    options: Mapping[str, Any],
    concurrency: int,
    workers: int | None,
    address: str | None,
    scores: bool = False,
) -> None:
    """Rerank batch-file lines on Ray for `rag-rerank batch --engine ray`.

    A line that is already a failure (bad JSON, unknown key) is reported through `on_done` here;
    the others run on `workers` actors with `concurrency` requests in flight each, and each
    record comes back through `on_record(index, record)` as soon as its block finishes (the
    caller's writer puts them in input order)."""
    ray = _require_ray()
    wire = []
    for index, line in enumerate(lines):
        if isinstance(line.item, Exception):
            on_done(index, line.item)
        else:
            request = json.dumps(line.item, ensure_ascii=False)
            wire.append({_INDEX: index, _LINE: line.number, _REQUEST: request})
    if not wire:
        return
    started = _connect(ray, address)
    try:
        from ray.data import DataContext

        ctx = DataContext.get_current()
        ctx.enable_progress_bars = False  # the CLI has its own bar; Ray's would interleave on stderr
        logging.getLogger("ray.data").setLevel(logging.ERROR)  # our summary and errors are the output
        if workers is None:
            workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        workers = min(workers, len(wire))
        batch_size = max(1, min(DEFAULT_BATCH_SIZE, -(-len(wire) // workers)))
        ds = ray.data.from_items(wire, override_num_blocks=max(1, -(-len(wire) // batch_size)))
        out = _map(
            ds,
            concurrency=workers,
            batch_size=batch_size,
            per_actor_concurrency=concurrency,
            num_cpus=1,
            num_gpus=0,
            wire=True,
            options=options,
            scores=scores,
        )
        for block in out.iter_batches(batch_size=None, batch_format="pyarrow"):
            records = block.column(_RECORD).to_pylist()
            for index, rec in zip(block.column(_INDEX).to_pylist(), records, strict=True):
                on_record(index, json.loads(rec))
    finally:
        if started:
            ray.shutdown()
