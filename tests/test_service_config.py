"""The service's configuration file (`rag_rerank.service.config`): every problem at once, named."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from rag_rerank.errors import InputError
from rag_rerank.retry import RetryPolicy
from rag_rerank.service.config import default_config, key_digest, load_config, parse_config, read_keys_file


def test_no_config_is_the_offline_local_model() -> None:
    config = default_config()
    assert list(config.models) == ["local"] and config.default_model == "local" and not config.auth
    assert config.models["local"].reranker_kwargs() == {"window_size": 50}


def test_models_take_the_librarys_options(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(
        "models:\n  fast: {backend: local, cache: c, options: {lambda: 0.5, top_k: 3, window_size: 20,"
        " policy: {max_attempts: 2}}}\ndefault_model: fast\n",
        encoding="utf-8",
    )
    config = load_config(path)
    spec = config.models["fast"]
    assert spec.defaults["lambda_"] == 0.5 and spec.defaults["window_size"] == 20
    assert isinstance(spec.defaults["policy"], RetryPolicy) and spec.defaults["policy"].max_attempts == 2
    assert spec.session["cache"] == str(tmp_path / "c")  # relative to the config file


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(InputError) as info:
        parse_config(
            {
                "models": {"a": {"backend": "local", "bakend": 1, "options": {"topk": 3}}},
                "keys": [
                    {"key": "k", "sha256": "ab"},
                    {"sha256": "zz"},
                    {"key": "m", "budget": {"max_cost": 1}},
                ],
                "limits": {"max_in_flight": 0, "deadline_s": "soon"},
                "cors": {"allow_origins": "*"},
                "default_model": "b",
                "extra": 1,
            }
        )
    paths = [v.path for v in info.value.violations]
    assert {
        "models.a.bakend",
        "models.a.options.topk",
        "keys[0]",
        "keys[1].sha256",
        "limits.max_in_flight",
        "limits.deadline_s",
        "cors.allow_origins",
        "default_model",
        "extra",
        "models.a.options.prices",
    } <= set(paths)
    topk = next(v for v in info.value.violations if v.path == "models.a.options.topk")
    assert "top_k" in topk.message  # did you mean


def test_keys_file(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"k2").hexdigest()
    path = tmp_path / "keys"
    path.write_text(f"k1\n# note\n{digest.upper()}\n", encoding="utf-8")
    keys = read_keys_file(path)
    assert [k.digest for k in keys] == [hashlib.sha256(b"k1").digest(), bytes.fromhex(digest)]
    assert key_digest(f"sha256:{digest}") == bytes.fromhex(digest)
    (tmp_path / "empty").write_text("# none\n", encoding="utf-8")
    with pytest.raises(InputError, match="holds no key"):
        read_keys_file(tmp_path / "empty")


def test_bad_option_values_are_named_at_once_with_their_config_path() -> None:
    """A value the library refuses is found in the file, with every other problem, under the path
    the operator wrote (`lambda`, not the library's `lambda_`): `top_k: 0` would otherwise start
    serving and refuse every request without `top_n`, blaming the client (QA finding #16)."""
    with pytest.raises(InputError) as info:
        parse_config(
            {
                "models": {
                    "m": {"backend": "local", "options": {"topk": 3, "lambda": 2, "max_tokens_per_chunk": 8}},
                    "n": {"options": {"top_k": 0, "layout": "zigzag"}},
                }
            }
        )
    paths = {v.path: v.message for v in info.value.violations}
    assert {
        "models.m.options.topk",
        "models.m.options.lambda",
        "models.m.options.max_tokens_per_chunk",
        "models.n.options.top_k",
        "models.n.options.layout",
    } <= set(paths), paths
    assert "[0, 1]" in paths["models.m.options.lambda"]
    assert "16" in paths["models.m.options.max_tokens_per_chunk"]
    valid = {"top_k": 3.0, "lambda": 0, "max_tokens_per_chunk": 16}
    config = parse_config({"models": {"m": {"options": valid}}})
    assert config.models["m"].defaults["top_k"] == 3.0  # valid values pass as written
