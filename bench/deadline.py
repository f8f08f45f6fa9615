"""How long a sync rerank takes against a server that never answers, with a 5 s deadline.

    PYTHONPATH=. python bench/deadline.py

Prints the elapsed time per backend (the client's own timeout is 60 s; the deadline should win).
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rag_rerank import BackendError, RetryPolicy, rerank
from rag_rerank.skill import load_skill
from tests.support.fake_llm import FakeLLM, Reply

ex = load_skill().example("happy-path")
for backend in ("openai", "anthropic"):
    with FakeLLM([Reply.openai_text("{}", delay=90.0)]) as srv:
        url = srv.openai_url if backend == "openai" else srv.anthropic_url
        t = time.monotonic()
        try:
            rerank(ex.query, ex.chunks, 3, backend=backend, base_url=url, policy=RetryPolicy(deadline_s=5))
        except BackendError as e:
            print(f"{backend}: returned after {time.monotonic() - t:.2f} s (deadline 5 s): {str(e)[:90]}")
