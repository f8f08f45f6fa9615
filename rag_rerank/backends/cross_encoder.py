"""`backend="cross-encoder"`: a sentence-transformers `CrossEncoder` scores (query, chunk) pairs.

The cheap, local first half of a cascade (a cross-encoder trims 200 candidates, the LLM orders
the best 50) and the reranker Haystack users know as `SentenceTransformersRanker`. Optional extra
`cross-encoder` (sentence-transformers and torch), imported only when this backend is built.

* **score** = sigmoid(logit * calibration_factor), so it lives in [0, 1] whatever the model's
  logit scale; `calibration_factor` (default 1.0) stretches or squeezes it, as in Haystack. The
  raw logits are read (activation off), so a model saved with its own activation is treated the
  same way. A model with more than one output label is refused: it is a classifier, not a reranker.
* **model**: a local folder, or a Hugging Face hub name that is already in the local cache. A
  name that is not cached is downloaded only when the environment allows it (neither
  `HF_HUB_OFFLINE` nor `TRANSFORMERS_OFFLINE` set); otherwise the error names the model and how
  to get it. Models are cached per process (one per model, device and max_length), so batch
  runs, eval and repeated `rerank` calls load it once.
* **answer**: the card's JSON object built by `scored.answer` (reasons quote the chunk's
  best-matching phrase), so the output guard and the post-pass judge it like an LLM's.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..embed.sentence_transformers import model_folder_problem, quiet_loading
from ..errors import InputError, MissingDependencyError, Violation
from ..evidence import best_of, passages_of
from ..models import RerankRequest
from ..shortening import decided_spans
from .base import Capabilities, Completion
from .scored import SCORE_DECIMALS, answer, labelled

CROSS_ENCODER_REASON = labelled("cross-encoder")
_models: dict[tuple[str, str | None, int | None], Any] = {}
_lock = threading.Lock()
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def downloads_allowed() -> bool:
    """False when the environment turned Hugging Face downloads off."""
    return not any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in _OFFLINE_VARS)


def _model_error(model: str, message: str) -> InputError:
    return InputError([Violation(path="model", value=model, message=message)])


def load_cross_encoder(model: str, device: str | None = "cpu", max_length: int | None = None) -> Any:
    """The cached `CrossEncoder` for (model, device, max_length), loaded on first use."""
    key = (model, device, max_length)
    with _lock:
        if key in _models:
            return _models[key]
        try:
            from sentence_transformers import CrossEncoder
        except ImportError:
            raise MissingDependencyError("the cross-encoder backend", "cross-encoder",
                                         "sentence-transformers") from None

        if problem := model_folder_problem(model):
            raise _model_error(model, f"cannot load cross-encoder model {model!r}: {problem}")
        local = os.path.isdir(os.path.expanduser(model))
        target = os.path.expanduser(model) if local else model
        try:
            ce = _load(CrossEncoder, target, device, max_length, local_files_only=True)
        except (OSError, ValueError) as first:
            if local or not downloads_allowed():
                how = ("is not a cross-encoder model folder" if local else
                       "is not a local folder and not in the Hugging Face cache, and downloads are off "
                       f"(HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE); fetch it once with `hf download {model}` "
                       "(or save it with CrossEncoder(...).save_pretrained(PATH)) and pass the folder")
                detail = " ".join(str(first).split())[:200]
                raise _model_error(model, f"cannot load cross-encoder model {model!r}: it {how} "
                                   f"[{type(first).__name__}: {detail}]") from None
            try:
                ce = _load(CrossEncoder, target, device, max_length, local_files_only=False)
            except (OSError, ValueError) as exc:
                detail = " ".join(str(exc).split())[:300]
                raise _model_error(model, f"cannot load cross-encoder model {model!r} (not a local folder, "
                                   f"not cached, and the download failed): {detail}") from None
        if ce.num_labels != 1:
            raise _model_error(model, f"{model!r} has {ce.num_labels} output labels; a reranking "
                               "cross-encoder has one relevance logit")
        _models[key] = ce
        return ce


def _load(cls: Any, target: str, device: str | None, max_length: int | None, *,
          local_files_only: bool) -> Any:

    with quiet_loading():
        return cls(target, device=device, max_length=max_length, local_files_only=local_files_only)


def _positive_int(name: str, value: Any, *, optional: bool) -> list[Violation]:
    if value is None and optional:
        return []
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{name} must be a positive integer, got {value!r}"
        return [Violation(path=name, value=value, message=msg)]
    return []


class CrossEncoderBackend:
    """Scores with a cross-encoder and answers in the card's format (see the module docstring)."""

    name = "cross-encoder"
    # Answers built by backends/scored.py: guard-valid by construction, never re-asked; no server.
    capabilities = Capabilities(scored=True)

    def __init__(self, model: str | None = None, *, batch_size: int = 32, device: str | None = "cpu",
                 max_length: int | None = None, calibration_factor: float = 1.0) -> None:
        bad = [*_positive_int("batch_size", batch_size, optional=False),
               *_positive_int("max_length", max_length, optional=True)]
        if not isinstance(model, str) or not model.strip():
            bad.append(Violation(path="model", value=model,
                                 message="the cross-encoder backend needs a model: a local folder or a "
                                 "Hugging Face name (CLI --model PATH)"))
        factor_ok = (isinstance(calibration_factor, (int, float)) and not isinstance(calibration_factor, bool)
                     and math.isfinite(calibration_factor) and calibration_factor > 0)
        if not factor_ok:
            bad.append(Violation(path="calibration_factor", value=calibration_factor,
                                 message=f"must be a number > 0, got {calibration_factor!r}"))
        if device is not None and not isinstance(device, str):
            bad.append(Violation(path="device", value=device, message="must be a string such as 'cpu'"))
        if bad:
            raise InputError(bad, headline="invalid cross-encoder options")
        assert isinstance(model, str)
        self.model: str | None = model
        self.batch_size, self.device, self.max_length = batch_size, device, max_length
        self.calibration_factor = float(calibration_factor)
        self._ce = load_cross_encoder(model, device, max_length)  # errors now, before any scoring

    def __getstate__(self) -> dict[str, Any]:
        # Pickled (a worker process) or deep-copied (a framework copying its components) without the
        # model's weights (hundreds of MB for a real cross-encoder, copied in memory per deep copy):
        # the copy takes the process's cached model, loading it there from `model` if need be.
        return {k: v for k, v in self.__dict__.items() if k != "_ce"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._ce = load_cross_encoder(state["model"], state["device"], state["max_length"])

    def logits(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """The model's raw relevance logit for each (query, text) pair, `batch_size` pairs at a time."""
        if not texts:
            return np.zeros(0)
        import torch

        out = self._ce.predict([(query, t) for t in texts], batch_size=self.batch_size,
                               activation_fn=torch.nn.Identity(), show_progress_bar=False,
                               convert_to_numpy=True)
        return np.asarray(out, dtype=np.float64).reshape(len(texts))

    def scores(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """sigmoid(logit * calibration_factor) per text, in [0, 1]."""
        z = self.logits(query, texts) * self.calibration_factor
        return 1.0 / (1.0 + np.exp(-np.clip(z, -500.0, 500.0)))

    def complete(self, prompt: str, request: RerankRequest, *, max_tokens: int,
                 feedback: Sequence[Violation] = (), previous: str | None = None) -> Completion:
        texts = [c.text for c in request.chunks]
        pieces, owner = passages_of(texts)  # a chunk shown as its evidence: scored by its best passage
        sc = self.scores(request.query, pieces)
        which = np.arange(len(texts))
        if len(pieces) != len(texts):
            sc, which = best_of(sc, owner, len(texts))
        # The passage the score was read from: what the reason quotes and meta.evidence reports.
        spans = decided_spans(texts, owner, which, [request.own_text(c) for c in request.chunks])
        obj = answer(request, [float(s) for s in sc], CROSS_ENCODER_REASON, decimals=SCORE_DECIMALS,
                     quote_in=spans)
        decided = {c.id: span for c, span in zip(request.chunks, spans, strict=True)}
        return Completion(text=json.dumps(obj, ensure_ascii=False), model=self.model, usage={},
                          decided=decided)

    async def acomplete(self, prompt: str, request: RerankRequest, *, max_tokens: int,
                        feedback: Sequence[Violation] = (), previous: str | None = None) -> Completion:
        """In a worker thread: a forward pass must not stall the other requests on the event loop."""
        return await asyncio.to_thread(self.complete, prompt, request, max_tokens=max_tokens)
