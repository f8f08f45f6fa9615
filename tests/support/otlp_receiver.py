"""An OTLP/HTTP trace receiver on 127.0.0.1: what a collector, Jaeger or Phoenix would be sent.

Why it exists: the end-to-end tracing test must send real OTLP requests with the real SDK exporter
and check what arrives, and the docs show a real trace, yet nothing here may touch the internet or
need a collector installed. It accepts `POST /v1/traces` with a protobuf body (the exporter's
default), decodes it with `opentelemetry-proto` into plain dicts, and keeps every span.

Usage::

    with OtlpReceiver() as rx:
        exporter = OTLPSpanExporter(endpoint=rx.endpoint)
        ...
    rx.spans  # [{"name", "trace_id", "span_id", "parent_span_id", "kind", "start", "end",
              #   "status", "attributes": {...}, "resource": {...}, "scope": "..."}]
"""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["OtlpReceiver", "decode"]


def _value(v: Any) -> Any:
    """An OTLP AnyValue as a Python value."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def decode(body: bytes) -> list[dict[str, Any]]:
    """The spans of one ExportTraceServiceRequest (protobuf bytes)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for rs in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append({
                    "name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex() or None, "kind": int(s.kind),
                    "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                    "status": {"code": int(s.status.code), "message": s.status.message},
                    "attributes": {kv.key: _value(kv.value) for kv in s.attributes},
                    "resource": resource, "scope": ss.scope.name,
                })
    return spans


class OtlpReceiver:
    """A threaded HTTP server keeping every span posted to /v1/traces (module docstring)."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet test output
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                spans = decode(body)
                with receiver._lock:
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
