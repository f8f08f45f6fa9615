"""Shared test set-up: the checkout on sys.path, a bounded Hypothesis profile, the card's examples.

The repository root goes first on sys.path so `rag_rerank` and `tests.support` resolve to this
checkout however pytest is started (`pytest`, `python -m pytest`, from another folder).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from rag_rerank.models import Chunk
    from rag_rerank.skill import SkillCard

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# No test may reach the internet or download a model.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Nor write into the user's ~/.cache: on-disk vector caches go to a fresh folder per run.
os.environ.setdefault("RAG_RERANK_CACHE_DIR", tempfile.mkdtemp(prefix="rag-rerank-test-cache-"))
# A response cache set in the developer's shell would answer the tests' calls from earlier runs.
os.environ.pop("RAG_RERANK_CACHE", None)

try:
    from hypothesis import HealthCheck, settings

    # Bounded so the whole suite stays fast on a shared 2-core machine; raise with
    # HYPOTHESIS_PROFILE=thorough when hunting a bug.
    settings.register_profile("default", max_examples=100, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("thorough", max_examples=3000, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
except ImportError:  # hypothesis is in the [test] extra; property tests importorskip it
    pass


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def card() -> SkillCard:
    from rag_rerank.skill import load_skill

    return load_skill()


@pytest.fixture(scope="session")
def happy_jsonl(card: SkillCard) -> str:
    return card.example("happy-path").chunks


@pytest.fixture(scope="session")
def adversarial_jsonl(card: SkillCard) -> str:
    return card.example("adversarial").chunks


@pytest.fixture
def happy_chunks(happy_jsonl: str) -> list[Chunk]:
    from rag_rerank.guard import parse_chunks

    return parse_chunks(happy_jsonl)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """In CI, a test that skips for want of the shared data fails (tests/support/shared_data.py)."""
    from tests.support.shared_data import fail_unexpected_skip

    outcome = yield
    fail_unexpected_skip(outcome.get_result())
