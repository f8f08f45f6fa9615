"""Real sockets for the connection failures a backend must tell apart, without leaving 127.0.0.1.

`closed_port()` is a port nothing listens on (bound, read, closed: the kernel answers a connection
with ECONNREFUSED). `Resetter` accepts every connection and resets it at once, the way a crashing
or overloaded server drops one: there *is* a server, so that failure must stay transient.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


def closed_port() -> int:
    """A TCP port on 127.0.0.1 with nothing listening on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Resetter:
    """A listener on 127.0.0.1 that accepts each connection and closes it with a TCP reset (RST)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by __exit__
                return
            self.accepted += 1
            conn.recv(65536)  # let the request arrive, then drop the connection
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
            conn.close()

    def __enter__(self) -> Resetter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (close alone may not)
        self.sock.close()
        self._thread.join(timeout=5)
