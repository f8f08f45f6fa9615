"""Instructions per LLM rerank call, stage by stage: a figure a busy machine cannot blur.

Wall-clock timings on a shared 2-core box move by 20% and more from one run to the next; the
number of instructions the CPU executes for the same work does not (within about 0.1% with
`PYTHONHASHSEED=0`). Each stage runs in its own process under valgrind's callgrind, with the
instrumentation switched on only around the measured loop (a 20-line C helper built with the
system's `valgrind/callgrind.h`, loaded with ctypes), over the 43 TREC DL19 queries with their
first `--passages` BM25 passages, after two warm-up rounds:

* `whole`: `Reranker("openai").rerank(...)` against `bench/fast_llm.py` (the server is another
  process and is not counted), top 10: everything the client does;
* `complete`: the openai backend's `complete` alone with the same prompts: the SDK's send and parse;
* `bare`: the bare SDK call with our exact request bodies (`client.chat.completions.create` and
  `json.loads` of the answer, as `bench/peers.py` times it): `complete` minus `bare` is our wrapper;
* `plan`: the request checked and rendered (`engine.plan`): `validated` (the input guard and the
  options) and `render` are its parts;
* `judge`: the output guard on the answer `bench/fast_llm.py` gives (`guard.output.judge`);
* `retry`: `retry.call_with_retries` with a backend that hands back that answer at once (no HTTP):
  the retry loop, the repair and the output guard around one accepted attempt;
* `postpass`: the post-pass on that answer (lexical embedder), `select` its MMR loop alone.

`--fresh` counts first sight instead, for the stages that run without a server (`plan`, `validated`,
`render`, `judge`, `retry`, `postpass`): every round, warm-up rounds included, sees texts this
process has not seen (a mark appended to each query and passage, as `bench/call_stages.py --fresh`
does), so the per-text caches hold nothing for them: what a batch of new questions costs.
`--new-reasons` (with `--fresh`) marks the front of each passage instead, so the answers' reasons,
which quote a ranked passage's opening words, are new in every round too, as a real model's are.

"ours" is `whole` minus `complete`: every stage but the SDK's send and parse.

Run:  python bench/instructions.py [--passages 20] [--stages whole complete ...] [--rounds 2]
        [--fresh [--new-reasons]]
Needs valgrind (callgrind), its header `valgrind/callgrind.h` and a C compiler (Debian: valgrind,
gcc); prints a Markdown table of instructions per call.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

STAGES = ("whole", "complete", "bare", "plan", "validated", "render", "judge", "retry", "postpass", "select")
HELPER = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS; }
"""


def child(stage: str, n: int, rounds: int, helper: str, fresh: bool = False,
          new_reasons: bool = False) -> None:
    """Run `stage` `rounds` times over the queries, instrumented between cg_start and cg_stop;
    `fresh`: each round (warm-up ones too) over texts not seen before, `new_reasons` with answers
    whose reasons are new too (module docstring)."""
    import peers

    import rag_rerank.engine as engine
    import rag_rerank.fallback as fallback
    import rag_rerank.postpass as postpass
    from rag_rerank import Reranker
    from rag_rerank.backends.base import Completion
    from rag_rerank.guard.limits import as_limits
    from rag_rerank.guard.output import judge
    from rag_rerank.options import check_request_options
    from rag_rerank.render import render
    from rag_rerank.retry import RetryPolicy, call_with_retries
    from tests.support.quoting_ranker import answer_for

    cg = ctypes.CDLL(helper)
    work = peers.load(peers.DEFAULT_DATA, n)
    if fresh and stage in ("whole", "complete", "bare", "select"):
        raise SystemExit(f"--fresh applies to the stages without a server that read text, not {stage}")

    def measured(call: Any, items: int) -> None:
        if fresh:  # `items` holds the two warm-up rounds, then the measured ones, each seen once
            per_round = items // (rounds + 2)
            for i in range(2 * per_round):
                call(i)
            settle()
            cg.cg_start()
            for i in range(2 * per_round, items):
                call(i)
            cg.cg_stop()
            return
        for _ in range(2):
            for i in range(items):
                call(i)
        settle()
        cg.cg_start()
        for _ in range(rounds):
            for i in range(items):
                call(i)
        cg.cg_stop()

    if stage == "bare":
        import openai

        with peers.fast_server() as url, Reranker("openai", model=peers.MODEL, base_url=url,
                                                  api_key=peers.KEY) as session:
            for q, chunks in work:  # the server records each request body
                session.rerank(q, chunks, peers.TOP)
            bodies = peers.server_json(url, "recorded")
            client = openai.OpenAI(base_url=url, api_key=peers.KEY, max_retries=0)

            def bare(i: int) -> None:
                json.loads(client.chat.completions.create(**bodies[i]).choices[0].message.content)

            measured(bare, len(bodies))
            client.close()
            return
    if stage in ("whole", "complete"):
        with peers.fast_server() as url, Reranker("openai", model=peers.MODEL, base_url=url,
                                                  api_key=peers.KEY) as session:
            if stage == "whole":
                measured(lambda i: session.rerank(work[i][0], work[i][1], peers.TOP), len(work))
                return
            options = session.options(top_k=peers.TOP)
            plans = [engine.plan(session._setup, q, chunks, options) for q, chunks in work]
            for q, chunks in work:  # the server learns each answer
                session.rerank(q, chunks, peers.TOP)
            budgets = [RetryPolicy().output_budget(p.ask, p.ask.top_k) for p in plans]
            backend = session.backend
            measured(lambda i: backend.complete(plans[i].prompt, plans[i].ask, max_tokens=budgets[i],
                                                timeout=60.0), len(plans))
            return
    session = Reranker("local")
    options = session.options(top_k=peers.TOP)
    lim = as_limits(options.limits)
    if fresh:
        base = work
        works = [peers.unseen(base, f"r{r}", new_reasons=new_reasons) for r in range(-2, rounds)]
        work = [item for one in works for item in one]  # each call i is one (round, query)
    # Planned before the count, as a call plans before its post-pass: what planning caches of a
    # text (`--fresh`) is warm for the later stages in a real call too. `plan` itself plans afresh.
    plans = [] if fresh and stage == "plan" else [engine.plan(session._setup, q, chunks, options)
                                                  for q, chunks in work]
    raws = [json.dumps(answer_for(p.prompt)) for p in plans]
    objs = [json.loads(r) for r in raws]
    class Answering:
        """A backend that answers each prompt with its precomputed answer, at once."""

        name = "answering"

        def complete(self, prompt: str, request: Any, **_: Any) -> Completion:
            return Completion(text=answers[prompt], model="bench", usage={"prompt_tokens": 1})

    answers = {p.prompt: raw for p, raw in zip(plans, raws, strict=True)}
    answering = Answering()
    calls = {
        "retry": lambda i: call_with_retries(answering, plans[i].ask, plans[i].prompt,
                                             guard_top_k=plans[i].ask.top_k, policy=plans[i].settings.policy,
                                             limits=lim),
        "plan": lambda i: engine.plan(session._setup, work[i][0], work[i][1], options),
        "validated": lambda i: check_request_options(work[i][0], work[i][1], options, lim),
        "render": lambda i: render(plans[i].ask),
        "judge": lambda i: judge(raws[i], plans[i].ask.chunks, plans[i].ask.top_k, lim, plans[i].ask.query),
        "postpass": lambda i: fallback.run_postpass(plans[i], objs[i], plans[i].view),
    }
    if stage == "select":
        captured: list[tuple[Any, Any]] = []
        inner = postpass.select

        def grab(*args: Any, **kwargs: Any) -> Any:
            captured.append((args, kwargs))
            return inner(*args, **kwargs)

        postpass.select = grab  # type: ignore[assignment]
        for i in range(len(work)):
            calls["postpass"](i)
        postpass.select = inner
        calls["select"] = lambda i: inner(*captured[i][0], **captured[i][1])
    measured(calls[stage], len(work))


def settle() -> None:
    """Before the count: collect, then freeze what the process holds (`gc.freeze`). The bench builds
    every round's inputs before counting (plans, answers, marked texts), which a process serving calls
    never holds; unfrozen, each full collection inside the count scans them all, and the first-sight
    post-pass at 20 passages counted 0.4 to 1.0 M a call more, by an amount that moved with where the
    checkout lies (19.55 M in one folder, 20.16 M for the same commit in another)."""
    gc.collect()
    gc.freeze()


def build_helper(folder: Path) -> Path | None:
    """The C helper as a shared library, or None (saying why) when it cannot be built."""
    for tool in ("valgrind", "cc"):
        if shutil.which(tool) is None:
            print(f"{tool} not found: this bench needs valgrind and a C compiler", file=sys.stderr)
            return None
    source, lib = folder / "cg.c", folder / "cg.so"
    source.write_text(HELPER, encoding="utf-8")
    done = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(source)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        print(f"cannot build the callgrind helper (is valgrind/callgrind.h installed?): {done.stderr[-500:]}",
              file=sys.stderr)
        return None
    return lib


def count(stage: str, n: int, rounds: int, helper: Path, folder: Path, sight: Sequence[str] = ()) -> int:
    """Instructions of `stage`'s measured loop (the largest 'totals' of callgrind's dumps); `sight`:
    the child's `--fresh` / `--new-reasons` flags."""
    out = folder / f"{stage}-{n}"
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p",
           sys.executable, str(Path(__file__).resolve()), "--child", stage, "--passages", str(n),
           "--rounds", str(rounds), "--helper", str(helper), *sight]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    totals = [int(line.split()[1]) for f in folder.glob(f"{stage}-{n}.*")
              for line in f.read_text(encoding="utf-8", errors="replace").splitlines()
              if line.startswith("totals:")]
    if done.returncode != 0 or not totals:
        raise SystemExit(f"{stage} at {n} passages failed: {done.stderr[-1500:]}")
    return max(totals)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passages", type=int, nargs="+", default=[20, 50])
    ap.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    ap.add_argument("--rounds", type=int, default=2, help="measured rounds over the 43 queries")
    ap.add_argument("--fresh", action="store_true", help="texts unseen by the process in every round")
    ap.add_argument("--new-reasons", action="store_true",
                    help="with --fresh: the answers' reasons new in every round too, as a real model's are")
    ap.add_argument("--child", choices=STAGES, help=argparse.SUPPRESS)
    ap.add_argument("--helper", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.new_reasons and not args.fresh:
        ap.error("--new-reasons goes with --fresh")
    if args.child:
        child(args.child, args.passages[0], args.rounds, args.helper, args.fresh, args.new_reasons)
        return 0
    import peers

    from tests.support.shared_data import need

    need(peers.DEFAULT_DATA)
    flags = [*(["--fresh"] if args.fresh else []), *(["--new-reasons"] if args.new_reasons else [])]
    with tempfile.TemporaryDirectory() as tmp:
        helper = build_helper(Path(tmp))
        if helper is None:
            return 1
        table: dict[str, dict[int, float]] = {}
        for n in args.passages:
            for stage in args.stages:
                calls = 43 * args.rounds
                counted = count(stage, n, args.rounds, helper, Path(tmp), flags)
                table.setdefault(stage, {})[n] = counted / calls
    sight = ", first sight of every text (--fresh)" if args.fresh else ""
    sight += ", new reasons in every answer (--new-reasons)" if args.new_reasons else ""
    print(f"Instructions per call (callgrind, PYTHONHASHSEED=0), TREC DL19, top {10}, "
          f"{args.rounds} rounds of 43 queries{sight}\n")
    print("| stage | " + " | ".join(f"{n} passages" for n in args.passages) + " |")
    print("|---|" + "---:|" * len(args.passages))
    for stage, row in table.items():
        print(f"| {stage} | " + " | ".join(f"{row[n] / 1e6:.3f} M" for n in args.passages) + " |")
    if "whole" in table and "complete" in table:
        print("| ours (whole - complete) | " + " | ".join(
            f"{(table['whole'][n] - table['complete'][n]) / 1e6:.3f} M" for n in args.passages) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
