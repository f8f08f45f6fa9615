"""Secrets kept out of every text a user, a log or a calling model sees.

An API key is not the only credential a caller hands us: a base URL may carry a password
(`https://user:pass@host/v1`, which httpx turns into a `Basic` header that a proxy's error page
may echo back base64-encoded), or a key in its query string (`?api-key=...`, as Azure-style
gateways take it). Errors, run metadata, batch records, MCP tool results and reprs are all built
from SDK messages and server bodies we do not control, so the rule is: collect every secret of a
call once (`secrets_of`), scrub every text with it (`scrub`), and show URLs only through
`display_url`, which masks the credentials while keeping the host and path a user must check.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from .errors import BackendError

MASK = "***"
# Environment variables that hold an API key or a URL that may carry credentials.
KEY_ENV = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "RERANK_API_KEY")
URL_ENV = ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "RERANK_BASE_URL", "RAG_RERANK_BASE_URL")
# A query parameter whose name says it is a credential (api-key, api_key, access_token, sig, ...).
_SECRET_PARAM = re.compile(r"key|token|secret|passw|pwd|auth|sig|credential|session", re.IGNORECASE)
# Shorter strings are not worth masking: they would mangle ordinary words in a message.
MIN_SECRET = 4
# The dummy key sent to local servers that need none; masking it would only confuse messages.
_NOT_SECRET = frozenset({"unused", "sk-no-key-required"})


def url_secrets(url: str | None) -> list[str]:
    """The credentials inside `url`: the password (raw, percent-decoded, and as the base64 of
    `user:password` that a Basic header carries), and the values of credential-like query
    parameters. [] for a URL without any, or for text that is not a URL."""
    if not url or not isinstance(url, str):
        return []
    try:
        parts = urlsplit(url)
        password, username = parts.password, parts.username
    except ValueError:
        return []
    out: list[str] = []
    if password:
        user, pw = unquote(username or ""), unquote(password)
        out += [password, pw, base64.b64encode(f"{user}:{pw}".encode()).decode()]
    for name, value in parse_qsl(parts.query, keep_blank_values=False):
        if _SECRET_PARAM.search(name) and value:
            out += [value, quote(value, safe="")]
    return out


def secrets_of(*keys: str | None, urls: Iterable[str | None] = ()) -> list[str]:
    """Every secret of one call: the keys given, the keys and URL credentials in the environment,
    and the credentials inside `urls`; longest first, so a key is masked before any part of it."""
    found = [*keys, *(os.environ.get(name) for name in KEY_ENV)]
    for url in (*urls, *(os.environ.get(name) for name in URL_ENV)):
        found += url_secrets(url)
    unique = {s for s in found if isinstance(s, str) and len(s) >= MIN_SECRET and s not in _NOT_SECRET}
    return sorted(unique, key=len, reverse=True)


def scrub(text: str, secrets: str | Sequence[str | None] | None) -> str:
    """`text` with every secret replaced by `***`."""
    if secrets is None:
        return text
    items = [secrets] if isinstance(secrets, str) else secrets
    for secret in sorted((s for s in items if s), key=len, reverse=True):
        if len(secret) >= MIN_SECRET and secret not in _NOT_SECRET:
            text = text.replace(secret, MASK)
    return text


def display_url(url: str | None) -> str | None:
    """`url` as it may be shown: the password and credential-like query values replaced by `***`,
    the scheme, user, host, port and path kept (they are what a user checks when a call fails)."""
    if not url or not isinstance(url, str):
        return url
    try:
        parts = urlsplit(url)
        password, hostinfo = parts.password, parts.netloc.rpartition("@")
    except ValueError:
        return scrub(url, url_secrets(url))
    netloc = parts.netloc
    if password is not None:
        user = hostinfo[0].split(":", 1)[0]
        netloc = f"{user}:{MASK}@{hostinfo[2]}"
    query = parts.query
    if query:
        pairs = [p.split("=", 1) for p in query.split("&")]
        query = "&".join(
            f"{p[0]}={MASK}" if len(p) == 2 and _SECRET_PARAM.search(unquote(p[0])) and p[1] else "=".join(p)
            for p in pairs
        )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def failure_summary(error: BaseException, api_key: str | None) -> str:
    """A failure as `meta.notes` and the log show it: its text with every secret of the call masked."""
    return scrub(str(error), secrets_of(api_key))


def redacted(error: BackendError, api_key: str | None) -> BackendError:
    """The same failure with any API key removed from its text (attempt details come from SDKs)."""
    secrets = secrets_of(api_key)
    text = str(error)
    if scrub(text, secrets) == text:
        return error
    attempts = [replace(a, detail=scrub(a.detail, secrets)) for a in error.attempts]
    head = scrub(text.split(" [#", 1)[0], secrets)
    return type(error)(head, attempts, usage=error.usage)  # an EmbedderError stays one
