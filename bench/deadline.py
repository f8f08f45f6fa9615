"""How long a sync rerank takes against a server that never answers, with a 5 s deadline.

    PYTHONPATH=. python bench/deadline.py

Prints the elapsed time per backend (the client's own timeout is 60 s; the deadline should win).
The call is expected to end in a BackendError; one that returns an answer or raises anything else
is a failed call, named in a final `FAILED: ...` line on stdout (exit code 1).
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from failures import TALLY, run_bench

from rag_rerank import BackendError, RetryPolicy, rerank
from rag_rerank.skill import load_skill
from tests.support.fake_llm import FakeLLM, Reply


def _since(t: float) -> str:
    return f"{time.monotonic() - t:.2f} s"


def main() -> int:
    ex = load_skill().example("happy-path")
    for backend in ("openai", "anthropic"):
        with FakeLLM([Reply.openai_text("{}", delay=90.0)]) as srv:
            url = srv.openai_url if backend == "openai" else srv.anthropic_url
            t = time.monotonic()
            TALLY.count()
            try:
                rerank(ex.query, ex.chunks, 3, backend=backend, base_url=url,
                       policy=RetryPolicy(deadline_s=5))
            except BackendError as e:
                print(f"{backend}: returned after {_since(t)} (deadline 5 s): {str(e)[:90]}")
            except Exception as e:  # not the deadline's BackendError: a failed call
                print(f"{backend}: raised after {_since(t)}: {type(e).__name__}: {str(e)[:90]}")
                TALLY.fail(backend, e)
            else:
                print(f"{backend}: answered after {_since(t)} from a server that never answers")
                TALLY.fail(backend, "rerank returned an answer; the deadline's BackendError was expected")
    return 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
