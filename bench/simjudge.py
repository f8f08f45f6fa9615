"""A simulated LLM judge: an OpenAI-compatible server on 127.0.0.1 whose biases we set.

**Its figures measure mechanisms, not model quality.** It answers from the qrels (the right answer
is known to it), then spoils that answer on purpose by the amounts you give it: position bias,
noise, miscalibrated scores, omitted ids, malformed output. What a benchmark run against it shows
is what a mechanism of ours (the bias meter, calibration, consistency passes, the output guard,
the post-pass) does to an answer spoiled that way, not how good any real model is.

Why it exists: no strong model can be called from here, and a real model's biases cannot be
dialled up and down to see whether a meter tracks them. This judge's can.

What it answers (the card's task, `rag_rerank.render.render`'s XML prompt): it reads `<query>`,
the JSONL records of `<chunks>` and `<top_k>`; looks the query up (candidates file: query text ->
qid) and each chunk id in the qrels (TREC, graded 0-3; unjudged = 0); and scores chunk i of n in
the order shown as

    s = 0.1 + 0.8 * grade / 3                      the truth, in [0.1, 0.9]
      + primacy * (1 - i / (n - 1))                favours what comes first (n > 1)
      + recency * i / (n - 1)                      favours what comes last (n > 1)
      + Normal(0, noise)                           keyed by (seed, query, id, position, n)
    s = clip(s, 0, 1), then the miscalibration map (`squash=(lo, hi)`: lo + (hi - lo) * s)

The noise is a function of the seed and of where the chunk was shown, not of a random stream: the
same prompt gets the same answer (as at temperature 0), the same chunk shown elsewhere gets
another draw (as a real model's answer changes with the order), and concurrency changes nothing.
It answers in the card's output format: the `top_k` best scores above 0.2 in `ranked`, each with a
reason quoting the chunk's best-matching phrase (built by `rag_rerank.backends.scored.reason_for`,
so the output guard's `misquoted` / `cites_chunk` accept it), every other chunk in `dropped` as
`below_min_score: 0.150` or `not_selected: 0.410` (the score in the detail, as the scored backends
write it). Equal scores are ordered by a hash of the id, never by position.

Knobs that spoil the form: `omit_rate` (each id is left out of both lists with this probability),
`format_error_rate` (a call's answer is fenced JSON, prose around the JSON, or truncated with
`finish_reason: "length"`; a re-ask is a new draw). Token log-probabilities: a one-token yes/no
request (`logprobs: true`, as `OpenAIBackend(scoring="logprobs")` sends) is answered with
p(yes) = the same score for the chunk shown alone (position 0 of 1), miscalibration included.

    python bench/simjudge.py --candidates bench/out/dl19-bm25-top20.jsonl \\
        --qrels ../shared/data/trec-dl19/qrels.txt --primacy 0.3 --noise 0.1 --port 8099
    rag-rerank eval --candidates ... --qrels ... --backend openai --base-url http://127.0.0.1:8099/v1

From Python: `with SimJudge.from_files(candidates, qrels, Knobs(primacy=0.3)) as judge:` and
`judge.openai_url` as the backend's `base_url`.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import math
import random
import re
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rag_rerank.backends.scored import labelled, query_term_weights, reason_for  # noqa: E402

_QUERY = re.compile(r"<query>(.*?)</query>", re.DOTALL)
_CHUNKS = re.compile(r"<chunks>(.*?)</chunks>", re.DOTALL)
_TOP_K = re.compile(r"<top_k>(\d+)</top_k>")
_PASSAGE = re.compile(r"<passage>(.*?)</passage>", re.DOTALL)
FLOOR = 0.2  # the card's minimum score: the judge ranks only what it scores above it
MAX_GRADE = 3
FLAVOURS = ("fenced", "prose", "truncated")
_DESCRIBE = labelled("judge")


@dataclass(frozen=True)
class Knobs:
    """How the judge spoils its answer (module docstring). All zero: the qrels' own order."""

    primacy: float = 0.0
    recency: float = 0.0
    noise: float = 0.0
    squash: tuple[float, float] | None = None  # every score mapped into [lo, hi], monotone
    omit_rate: float = 0.0
    format_error_rate: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("primacy", "recency", "noise"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)!r}")
        for name in ("omit_rate", "format_error_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.squash is not None and not (0 <= self.squash[0] < self.squash[1] <= 1):
            raise ValueError(f"squash must be (lo, hi) with 0 <= lo < hi <= 1, got {self.squash!r}")


def _unit(*key: object) -> random.Random:
    """A random stream that is a pure function of `key` (blake2b of its parts)."""
    digest = hashlib.blake2b("\x1f".join(map(str, key)).encode("utf-8"), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


def _id_order(cid: str) -> int:
    return int.from_bytes(hashlib.blake2b(cid.encode("utf-8"), digest_size=4).digest(), "big")


class SimJudge:
    """The judge and its HTTP server (module docstring). `grades[qid][docid]` are the qrels,
    `queries[query text] = qid` how a prompt's query is found, `docids[(qid, text)] = docid` how a
    one-passage yes/no prompt (which shows no id) is found."""

    def __init__(self, grades: Mapping[str, Mapping[str, int]], queries: Mapping[str, str],
                 knobs: Knobs = Knobs(), docids: Mapping[tuple[str, str], str] | None = None, *,
                 port: int = 0) -> None:
        self.grades = grades
        self.port = port  # 0: any free port
        self.queries = dict(queries)
        self.docids = dict(docids or {})
        self.knobs = knobs
        self.calls = 0  # HTTP requests answered (chat completions)
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_files(cls, candidates: str | Path, qrels: str | Path, knobs: Knobs = Knobs(), *,
                   port: int = 0) -> SimJudge:
        """A judge for the queries of a candidates file (`rag-rerank eval`'s format) and TREC qrels."""
        grades: dict[str, dict[str, int]] = {}
        for line in Path(qrels).read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) == 4:
                grades.setdefault(parts[0], {})[parts[2]] = int(parts[3])
        queries: dict[str, str] = {}
        docids: dict[tuple[str, str], str] = {}
        for line in Path(candidates).read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            qid = str(row["qid"])
            queries[row["query"]] = qid
            for c in row["chunks"]:
                docids[(qid, c["text"])] = str(c["id"])
        return cls(grades, queries, knobs, docids, port=port)

    # --- the judgement ---------------------------------------------------------------------
    def truth(self, qid: str, cid: str) -> float:
        """The unspoilt score of a chunk: 0.1 + 0.8 * grade / 3 (unjudged: grade 0)."""
        grade = max(0, min(MAX_GRADE, int(self.grades.get(qid, {}).get(cid, 0))))
        return 0.1 + 0.8 * grade / MAX_GRADE

    def miscalibrate(self, score: float) -> float:
        if self.knobs.squash is None:
            return score
        lo, hi = self.knobs.squash
        return lo + (hi - lo) * score

    def scores(self, qid: str, ids: Sequence[str]) -> list[float]:
        """The judge's score of each chunk of `ids`, shown in that order (module docstring)."""
        k, n = self.knobs, len(ids)
        out = []
        for i, cid in enumerate(ids):
            s = self.truth(qid, cid)
            if n > 1:  # a chunk shown alone has no position to be favoured for
                where = i / (n - 1)
                s += k.primacy * (1.0 - where) + k.recency * where
            if k.noise:
                s += _unit(k.seed, "noise", qid, cid, i, n).gauss(0.0, k.noise)
            out.append(self.miscalibrate(min(1.0, max(0.0, s))))
        return out

    def answer(self, prompt: str, attempt: int = 0) -> tuple[str, str]:
        """(the answer's text, finish_reason) for a rendered task; `attempt` counts re-asks."""
        query = html.unescape(m.group(1)) if (m := _QUERY.search(prompt)) else ""
        qid = self.queries.get(query)
        if qid is None:
            raise LookupError(f"simjudge: unknown query {query[:80]!r}")
        top_k = int(m.group(1)) if (m := _TOP_K.search(prompt)) else 5
        body = m.group(1) if (m := _CHUNKS.search(prompt)) else ""
        records = [json.loads(line) for line in body.split("\n") if line.strip()]
        ids = [str(r["id"]) for r in records]
        texts = [str(r["text"]) for r in records]
        scores = self.scores(qid, ids)
        k = self.knobs
        n = len(ids)
        shown = [i for i in range(n) if not (k.omit_rate and
                                             _unit(k.seed, "omit", qid, ids[i], i, n).random() < k.omit_rate)]
        order = sorted(shown, key=lambda i: (-round(scores[i], 3), _id_order(ids[i])))
        weights = query_term_weights(query, texts)
        ranked: list[dict[str, Any]] = []
        dropped: list[dict[str, Any]] = []
        for i in order:
            score = round(scores[i], 3)
            if score <= FLOOR:
                dropped.append({"id": ids[i], "reason": f"below_min_score: {score:.3f}"})
            elif len(ranked) >= top_k:
                dropped.append({"id": ids[i], "reason": f"not_selected: {score:.3f}"})
            elif (reason := reason_for(texts[i], i, score, weights, _DESCRIBE)) is not None:
                ranked.append({"id": ids[i], "score": score, "reason": reason})
            else:
                dropped.append({"id": ids[i], "reason": "no_citable_phrase: nothing concrete to quote"})
        text = json.dumps({"ranked": ranked, "dropped": dropped}, ensure_ascii=False)
        return self._spoil(text, prompt, attempt)

    def _spoil(self, text: str, prompt: str, attempt: int) -> tuple[str, str]:
        k = self.knobs
        if not k.format_error_rate:
            return text, "stop"
        draw = _unit(k.seed, "format", hashlib.blake2b(prompt.encode("utf-8")).hexdigest(), attempt)
        if draw.random() >= k.format_error_rate:
            return text, "stop"
        flavour = FLAVOURS[draw.randrange(len(FLAVOURS))]
        if flavour == "fenced":
            return f"```json\n{text}\n```", "stop"
        if flavour == "prose":
            return f"Here is the ranking you asked for:\n{text}\nI hope this helps.", "stop"
        return text[: max(1, len(text) // 2)], "length"

    def yes_probability(self, prompt: str) -> float:
        """p(yes) for a one-passage relevance question: the chunk's score shown alone."""
        query = html.unescape(m.group(1)) if (m := _QUERY.search(prompt)) else ""
        qid = self.queries.get(query)
        if qid is None:
            raise LookupError(f"simjudge: unknown query {query[:80]!r}")
        raw = m.group(1) if (m := _PASSAGE.search(prompt)) else ""
        try:
            record = json.loads(raw)
        except ValueError:
            record = html.unescape(raw)
        if isinstance(record, dict):  # the chunk's JSON record, as render_relevance shows it
            cid = str(record.get("id", ""))
        else:
            cid = self.docids.get((qid, str(record)), "")
        return self.scores(qid, [cid])[0] if cid else self.miscalibrate(0.1)

    # --- HTTP --------------------------------------------------------------------------------
    def reply(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        messages = body.get("messages") or []
        users = [m for m in messages if m.get("role") == "user"]
        prompt = _text(users[0].get("content")) if users else ""
        attempt = sum(1 for m in messages if m.get("role") == "assistant")
        model = str(body.get("model") or "simjudge")
        with self._lock:
            self.calls += 1
        try:
            if body.get("logprobs"):
                return 200, _logprob_body(self.yes_probability(prompt), model)
            text, finish = self.answer(prompt, attempt)
        except LookupError as exc:
            return 400, {"error": {"message": str(exc), "type": "invalid_request_error", "code": None}}
        return 200, _chat_body(text, finish, model)

    def start(self) -> SimJudge:
        judge = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body in separate writes: no 40 ms ACK wait

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, status: int, payload: Mapping[str, Any]) -> None:
                data = json.dumps(payload).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": "simjudge", "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": "not found", "type": "not_found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = None
                if not isinstance(body, dict) or not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(400, {"error": {"message": "simjudge answers chat completions only",
                                               "type": "invalid_request_error"}})
                    return
                self._send(*judge.reply(body))

        httpd = _Server(("127.0.0.1", self.port), Handler)
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="simjudge", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> SimJudge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def openai_url(self) -> str:
        """The `base_url` to give the openai backend."""
        assert self._httpd is not None, "simjudge not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"


class _Server(ThreadingHTTPServer):
    # A benchmark opens dozens of connections at once (queries x yes/no questions); the default
    # backlog of 5 refused some, and the client's retry of a whole call inflated the request count.
    request_queue_size = 256
    daemon_threads = True


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(str(p.get("text", "")) for p in content or [] if isinstance(p, Mapping))


def _chat_body(text: str, finish: str, model: str) -> dict[str, Any]:
    return {"id": "chatcmpl-simjudge", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": 0, "completion_tokens": len(text) // 4,
                      "total_tokens": len(text) // 4}}


def _logprob_body(p_yes: float, model: str) -> dict[str, Any]:
    """A one-token answer with its top log-probabilities, the shape llama.cpp and vLLM send."""
    p = min(1.0 - 1e-6, max(1e-6, p_yes))
    tops = sorted([("yes", math.log(p)), ("no", math.log(1.0 - p))], key=lambda t: -t[1])
    top = [{"token": tok, "logprob": lp, "bytes": list(tok.encode())} for tok, lp in tops]
    content = [{**top[0], "top_logprobs": top}]
    return {"id": "chatcmpl-simjudge", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": tops[0][0]},
                         "finish_reason": "length", "logprobs": {"content": content}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1}}


def _squash(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    try:
        return float(lo), float(hi)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI such as 0.6,0.9, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Serve a simulated judge with set biases on 127.0.0.1 "
                                "(its figures measure mechanisms, not model quality).")
    p.add_argument("--candidates", required=True, help="candidates file (rag-rerank eval's format)")
    p.add_argument("--qrels", required=True, help="TREC qrels, graded 0-3")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    p.add_argument("--primacy", type=float, default=0.0, help="score added to the first chunk, falling to 0")
    p.add_argument("--recency", type=float, default=0.0, help="score added to the last chunk, falling to 0")
    p.add_argument("--noise", type=float, default=0.0, help="std of Gaussian noise on each score")
    p.add_argument("--squash", type=_squash, default=None, metavar="LO,HI",
                   help="miscalibration: every score mapped into [LO, HI]")
    p.add_argument("--omit-rate", type=float, default=0.0, help="probability an id is left out")
    p.add_argument("--format-error-rate", type=float, default=0.0,
                   help="probability an answer is fenced, wrapped in prose or truncated")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    knobs = Knobs(args.primacy, args.recency, args.noise, args.squash, args.omit_rate,
                  args.format_error_rate, args.seed)
    judge = SimJudge.from_files(args.candidates, args.qrels, knobs, port=args.port)
    with judge:
        print(f"simjudge serving on {judge.openai_url} (mechanisms, not model quality); Ctrl-C stops it",
              flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
