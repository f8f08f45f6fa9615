"""`rag-rerank mcp`: serve the rerank tool over MCP stdio (the `mcp` extra)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .common import EXIT_OK


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("mcp", "serve the rerank tool over MCP stdio (needs rag-rerank[mcp])",
                "Serve the rerank tool over MCP stdio: an MCP client (an agent, a desktop app)\n"
                "starts this command and calls the tool. Needs the mcp extra:\n"
                "  pip install 'rag-rerank[mcp]'")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..mcp_server import serve  # imports the mcp SDK: only when serving

    serve()
    return EXIT_OK
