"""`rag-rerank mcp`: the rerank tool served over MCP stdio with the official `mcp` SDK.

The tool is registered from the skill card (name `rerank_chunks`, the card's description, the
same argument schema as the Anthropic tool), so MCP clients see exactly what the OpenAI and
Anthropic definitions describe. The low-level `Server` is used rather than the decorator API
because the schema must come from the card, not from a Python signature.

Errors the caller can act on (bad arguments, a failing backend) come back as a tool result with
`isError: true` and the structured error from `tools.call_tool` as JSON text, so the calling
model sees which field is wrong; only protocol problems (an unknown tool name) are protocol
errors. When `fallback="local"` answered, the result says so to the calling model: a `fallback`
field in the structured result, a warning line of text, and the run metadata in `_meta`. The SDK
is an optional extra: without it `serve()` raises `MissingDependencyError`.

Backend options for the tool calls come from the environment, so an MCP client config can pick
them without code: RAG_RERANK_BACKEND (default local), RAG_RERANK_MODEL, RAG_RERANK_BASE_URL,
RAG_RERANK_EMBEDDER (default lexical), RAG_RERANK_FALLBACK. API keys are read by the backends
from their usual variables (OPENAI_API_KEY, ANTHROPIC_API_KEY). A misspelt value is refused when
the server starts (`InputError` naming the variable, CLI exit 2), not reported on every tool call
of a session that can never succeed; the check is offline and loads no model.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .backends.common import base_url_problem
from .backends.factory import BACKENDS, unused_option_violations
from .embed import parse_embedder_spec
from .errors import InputError, MissingDependencyError, Violation
from .fallback_chain import as_chain, parse_steps
from .redaction import scrub, secrets_of
from .session import SessionCache
from .skill import SkillCard, load_skill
from .tools import anthropic_tool, fallback_field, run_tool

_ENV_OPTIONS = {
    "backend": "RAG_RERANK_BACKEND",
    "model": "RAG_RERANK_MODEL",
    "base_url": "RAG_RERANK_BASE_URL",
    "embedder": "RAG_RERANK_EMBEDDER",
    "fallback": "RAG_RERANK_FALLBACK",
}


def options_from_env(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The `rerank()` options an MCP client chose through environment variables.

    Raises `InputError` with one violation per bad variable (its name as the path, the allowed
    values in the message). An empty variable counts as unset.
    """
    env = os.environ if env is None else env
    options: dict[str, Any] = {key: env[var] for key, var in _ENV_OPTIONS.items() if env.get(var)}
    problems = [*_misspelt_names(env), *_check_options(options)]
    # A variable already named as malformed is not named a second time as unused.
    problems += [v for v in _missing_settings(options, env) if v.path not in {p.path for p in problems}]
    if problems:
        raise InputError(problems, headline="invalid MCP server configuration")
    if "fallback" in options:
        options["fallback"] = parse_steps(options["fallback"])
    return options


# Variables of the same prefix read elsewhere (the vector cache, tracebacks, benches and tests).
_OTHER_VARIABLES = frozenset({"RAG_RERANK_CACHE_DIR", "RAG_RERANK_DEBUG", "RAG_RERANK_DATA",
                              "RAG_RERANK_LLM_TESTS"})


def _misspelt_names(env: Mapping[str, str]) -> list[Violation]:
    """A variable that is nearly one of ours (RAG_RERANK_EMBEDER, rag_rerank_backend) would be
    ignored and the server would run on defaults the user meant to change; name it instead."""
    prefix = "RAG_RERANK_"
    ours = {var.removeprefix(prefix): var for var in _ENV_OPTIONS.values()}
    problems = []
    for name in env:
        if not name.upper().startswith(prefix) or name in _OTHER_VARIABLES or name in _ENV_OPTIONS.values():
            continue
        close = difflib.get_close_matches(name.upper().removeprefix(prefix), list(ours), n=1, cutoff=0.75)
        if close:
            problems.append(Violation(path=name, value=env[name], message="not a setting of the MCP server; "
                                      f"did you mean {ours[close[0]]}?"))
    return problems


def _check_options(options: Mapping[str, str]) -> list[Violation]:
    """Names and shapes only: no model is loaded and no server contacted (an MCP host waits on start-up)."""

    problems: list[Violation] = []
    backend = options.get("backend")
    if backend is not None and backend not in BACKENDS:
        message = f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}"
        problems.append(Violation(path=_ENV_OPTIONS["backend"], value=backend, message=message))
    embedder = options.get("embedder")
    if embedder is not None:
        try:
            parse_embedder_spec(embedder, path=_ENV_OPTIONS["embedder"])
        except InputError as exc:
            problems.extend(exc.violations)
    fallback = options.get("fallback")
    if fallback is not None:  # one step or a comma-separated chain: local, cross-encoder, input
        try:
            as_chain(parse_steps(fallback))
        except InputError as exc:
            problems.extend(replace(v, path=_ENV_OPTIONS["fallback"]) for v in exc.violations)
    base_url = options.get("base_url")
    if base_url is not None and (problem := base_url_problem(base_url)):
        problems.append(Violation(path=_ENV_OPTIONS["base_url"], value=base_url, message=problem))
    return problems


def _missing_settings(options: Mapping[str, str], env: Mapping[str, str]) -> list[Violation]:
    """A backend that cannot run without a setting the environment does not give: every tool call
    of the session would fail, naming a CLI flag (`--model`) the operator cannot pass."""

    backend = options.get("backend")
    # RAG_RERANK_MODEL=gpt-4o-mini without RAG_RERANK_BACKEND=openai: every call would rank with the
    # local scorer, silently (a URL likewise); rerank() refuses them, here named by their variables.
    unused = unused_option_violations(backend or "local", model=options.get("model"),
                                      base_url=options.get("base_url"))
    if unused:
        return [Violation(path=_ENV_OPTIONS[v.path], value=options[v.path],
                          message=f"{v.message} (set {_ENV_OPTIONS['backend']})") for v in unused]
    if backend == "cross-encoder" and not options.get("model"):
        return [Violation(path=_ENV_OPTIONS["model"], message="the cross-encoder backend needs a model: set "
                          f"{_ENV_OPTIONS['model']} to a local folder or a Hugging Face name in the "
                          "local cache")]
    if backend == "rerank-api" and not options.get("base_url") and not env.get("RERANK_BASE_URL"):
        return [Violation(path=_ENV_OPTIONS["base_url"], message="the rerank-api backend needs the server's "
                          f"URL: set {_ENV_OPTIONS['base_url']} (or RERANK_BASE_URL), e.g. http://127.0.0.1:8000/v1")]
    return []


def _import_mcp() -> tuple[Any, Any, Any]:
    try:
        import mcp_types
        from mcp.server.lowlevel import Server
        from mcp.server.stdio import stdio_server
    except ImportError:
        raise MissingDependencyError("the MCP server", "mcp", "mcp>=2.3") from None
    return mcp_types, Server, stdio_server


def build_server(card: SkillCard | None = None, options: Mapping[str, Any] | None = None) -> Any:
    """An `mcp` low-level `Server` exposing the card's tool; `options` go to every `rerank()`."""
    types, server_cls, _ = _import_mcp()
    card = card or load_skill()
    definition = anthropic_tool(card)
    opts = dict(options_from_env() if options is None else options)
    # One Reranker for the server's life, built on the first call: its backend keeps its connection
    # pool and its embedder its model from call to call (a bad setting is reported per call).
    sessions = SessionCache()
    tool = types.Tool(
        name=definition["name"],
        title=card.title,
        description=definition["description"],
        input_schema=definition["input_schema"],
    )

    async def on_list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=[tool])

    async def on_call_tool(ctx: Any, params: Any) -> Any:
        if params.name != tool.name:
            # An unknown tool is a protocol-level mistake of the client, not a tool failure.
            from mcp.shared.exceptions import MCPError

            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"unknown tool {params.name!r}; this server has {tool.name!r}",
            )
        import anyio

        # rerank() is synchronous (a network backend blocks); keep the event loop responsive.
        meta = None
        try:
            result, meta = await anyio.to_thread.run_sync(
                lambda: run_tool(dict(params.arguments or {}), sessions=sessions, **opts))
        except Exception as exc:  # a bug of ours is still a tool failure, not a broken protocol session
            # Its text may quote a server's answer or a URL: the calling model never sees a credential.
            hidden = secrets_of(opts.get("api_key"), urls=[opts.get("base_url")])
            message = scrub(f"{type(exc).__name__}: {exc}", hidden)
            result = {"error": {"type": "internal_error", "message": message}}
        is_error = "error" in result
        fell = fallback_field(meta) if meta is not None else None
        if fell is not None:
            # The result object alone looks exactly like the configured backend's ranking: the
            # calling model is told in the structured result and in a line of text of its own.
            result = {**result, "fallback": fell}
        content = [types.TextContent(text=json.dumps(result, ensure_ascii=False))]
        if fell is not None:
            content.append(types.TextContent(text=f"warning: {fell['notice']}"))
        return types.CallToolResult(
            content=content,
            structured_content=result,
            is_error=is_error,
            meta={"rag-rerank/run": meta.to_dict()} if meta is not None else None,
        )

    return server_cls(
        "rag-rerank",
        version=_version(),
        title=card.title,
        instructions=card.summary,
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("rag-rerank")
    except Exception:  # not installed (a checkout on sys.path): the version is informational only
        return "0"


def serve(card: SkillCard | None = None) -> None:
    """Serve over stdio until the client closes stdin.

    The environment is checked first (`InputError`), before the SDK is imported or anything is
    read from stdin, so a bad configuration ends the process instead of failing every call.
    """
    options = options_from_env()
    _, _, stdio_server = _import_mcp()
    import anyio

    server = build_server(card, options)

    async def _run() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(_run)
