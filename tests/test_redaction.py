"""Credentials never reach an error, meta, a repr, a pickle, a CLI line or an MCP tool result.

The leaks these pin were real: a base URL with a password (`http://user:pass@host/v1`) was quoted
in backend reprs and in base-URL violations, and a server that echoed the request's `Authorization:
Basic ...` header (base64 of `user:pass`) or the password itself had it copied into the error, the
fallback note in meta and the pickled exception. The real OpenAI / Anthropic SDKs talk to a server
on 127.0.0.1 that echoes what it was sent, as a misconfigured proxy does.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from rag_rerank import make_backend, rerank
from rag_rerank.errors import BackendError, InputError, RerankError
from rag_rerank.redaction import display_url, scrub, secrets_of, url_secrets
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-test-SECRET-0123456789"
PASSWORD = "hunter2-pass"
CHUNKS = [{"id": "a", "text": "the cat sat on the mat"}, {"id": "b", "text": "dogs bark loudly at night"}]
BASIC = base64.b64encode(f"user:{PASSWORD}".encode()).decode()


def _leaks(text: str) -> list[str]:
    return [s for s in (KEY, PASSWORD, BASIC) if s in text]


def _echo(req: RecordedRequest) -> Reply:
    """A server that quotes every credential it received back in its error message."""
    said = " ".join(f"{k}={v}" for k, v in req.headers.items() if k in ("authorization", "x-api-key"))
    return Reply.openai_error(401, f"rejected {said} path={req.path} password={PASSWORD}")


def _anthropic_echo(req: RecordedRequest) -> Reply:
    said = " ".join(f"{k}={v}" for k, v in req.headers.items() if k in ("authorization", "x-api-key"))
    return Reply.anthropic_error(401, f"rejected {said} password={PASSWORD}", type_="authentication_error")


# --- the helpers ------------------------------------------------------------------------------------

def test_url_secrets_finds_the_password_its_basic_header_and_key_like_query_values() -> None:
    found = url_secrets(f"https://user:{PASSWORD}@host/v1?api-key=QKEY123&model=m&access_token=TOK456")
    assert PASSWORD in found and BASIC in found and "QKEY123" in found and "TOK456" in found
    assert "m" not in found and "user" not in found
    assert url_secrets("http://127.0.0.1:8000/v1") == [] and url_secrets(None) == []


def test_display_url_masks_credentials_and_keeps_what_a_user_checks() -> None:
    shown = display_url(f"https://user:{PASSWORD}@host:8443/v1?api-key=QKEY123&model=m")
    assert shown == "https://user:***@host:8443/v1?api-key=***&model=m"
    assert display_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"


def test_secrets_of_reads_keys_and_url_credentials_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"https://user:{PASSWORD}@proxy/v1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    hidden = secrets_of()
    assert scrub(f"{KEY} {PASSWORD} {BASIC}", hidden) == "*** *** ***"


def test_scrub_masks_the_longest_secret_first() -> None:
    assert scrub("abcdef-long", ["abcd", "abcdef-long"]) == "***"


# --- every surface, through the real SDKs ------------------------------------------------------------

@pytest.mark.parametrize("backend", ["openai", "anthropic"])
def test_a_password_in_base_url_never_reaches_the_error_its_pickle_or_meta(backend: str) -> None:
    handler = _echo if backend == "openai" else _anthropic_echo
    with FakeLLM(handler=handler) as srv:
        root = srv.openai_url if backend == "openai" else srv.anthropic_url
        url = root.replace("http://", f"http://user:{PASSWORD}@")
        with pytest.raises(BackendError) as info:
            rerank("cat", CHUNKS, backend=backend, base_url=url, api_key=KEY, model="m")
        err = info.value
        assert srv.requests, "the request reached the server"
        shown = [str(err), repr(err), repr(err.args), "".join(traceback.format_exception(err)),
                 repr(pickle.dumps(err)), *(a.detail for a in err.attempts)]
        assert not [leak for text in shown for leak in _leaks(text)], shown[0]
        assert "***" in str(err)
        fell = rerank("cat", CHUNKS, backend=backend, base_url=url, api_key=KEY, model="m", fallback="local")
        assert fell.meta is not None and fell.meta.fallback == "local"
        assert not _leaks(json.dumps(fell.meta.to_dict())) and not _leaks(repr(fell))


def test_a_key_in_the_query_string_is_scrubbed_from_errors() -> None:
    with FakeLLM(handler=_echo) as srv, pytest.raises(BackendError) as info:
        rerank("cat", CHUNKS, backend="openai", base_url=srv.openai_url + f"?api-key={PASSWORD}",
               api_key=KEY, model="m")
    assert not _leaks(str(info.value))


def test_backend_repr_and_base_url_violations_mask_the_password() -> None:
    url = f"http://user:{PASSWORD}@127.0.0.1:1/v1"
    for name in ("openai", "anthropic"):
        assert not _leaks(repr(make_backend(name, base_url=url, api_key=KEY, model="m")))
    with pytest.raises(InputError) as info:
        rerank("cat", CHUNKS, backend="openai", base_url=f"http://user:{PASSWORD}@host:99999/v1",
               api_key=KEY, model="m")
    assert not _leaks(str(info.value)) and not _leaks(repr(info.value.violations))
    with pytest.raises(InputError) as unused:
        rerank("cat", CHUNKS, backend="local", base_url=url)
    assert not _leaks(repr(unused.value.violations))


def test_a_missing_key_error_masks_the_urls_password() -> None:
    with pytest.raises(RerankError) as info:
        make_backend("openai", base_url=f"https://user:{PASSWORD}@api.example.com/v1", model="m")
    assert "***" in str(info.value) and not _leaks(str(info.value))


def test_the_cli_error_line_masks_an_echoed_basic_header(tmp_path: Path) -> None:
    chunks = tmp_path / "c.jsonl"
    chunks.write_text("".join(json.dumps(c) + "\n" for c in CHUNKS), encoding="utf-8")
    with FakeLLM(handler=_echo) as srv:
        url = srv.openai_url.replace("http://", f"http://user:{PASSWORD}@")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": KEY, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run([sys.executable, "-m", "rag_rerank", "rerank", "-q", "cat", "-c", str(chunks),
                               "--backend", "openai", "--base-url", url, "--model", "m"],
                              capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 3, proc.stderr
    assert "***" in proc.stderr and not _leaks(proc.stdout + proc.stderr), proc.stderr
