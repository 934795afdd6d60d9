"""The metrics HTTP server: ``/metrics`` from rendered bytes, ``/healthz``, ``/readyz``.

A scrape asks its body source for the newest :class:`Rendered` and writes it, plus one line
with the snapshot age. The source renders a snapshot at most once, from memory (the metrics
component); nothing here calls NVML or waits for the sampler.
"""

from __future__ import annotations

import errno
import gzip
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from nodeagent_exporters.render import Rendered, age_lines

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9475``, ``:9475`` for every address) into a bind pair.

    Raises:
        ValueError: the address has no port or the port is not 0..65535.
    """
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(
            f"metrics address {address!r} is not HOST:PORT; use e.g. 0.0.0.0:9475 or [::1]:9475"
        )
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Certificate and key to serve HTTPS; with ``client_ca`` clients must present a cert."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def context(self) -> ssl.SSLContext:
        """A server context (TLS 1.2+)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        # ssl names neither file when one is missing or not PEM: they are named here.
        for path in (self.cert, self.key, self.client_ca):
            if path is not None and not path.is_file():
                raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except ssl.SSLError:
            raise OSError(
                errno.EINVAL, "not a PEM certificate and its key", f"{self.cert} and {self.key}"
            ) from None
        if self.client_ca is not None:
            try:
                ctx.load_verify_locations(self.client_ca)
            except ssl.SSLError:
                where = str(self.client_ca)
                raise OSError(errno.EINVAL, "not PEM CA certificates", where) from None
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


BodySource = Callable[[], Rendered | None]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Many scrapers reconnecting at once must not be refused by a short listen backlog.
    request_queue_size = 128
    body: BodySource
    ready_check: Callable[[], bool]
    live_check: Callable[[], bool]
    tls: ssl.SSLContext | None
    clock: Callable[[], float]

    def get_request(self) -> tuple[socket.socket, tuple[str, int]]:
        conn, addr = super().get_request()
        # Headers and body go out in separate writes; without NODELAY a small (gzip) body waits
        # for the client's delayed ACK, adding ~40 ms to every scrape.
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            # The handshake runs lazily in the handler thread, so a slow or hostile client
            # cannot stall the accept loop.
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, addr


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection
    timeout = 30  # seconds an idle keep-alive connection may hold a thread

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._metrics()
        elif path == "/healthz":
            alive = self.server.live_check()
            self._send(
                200 if alive else 503,
                b"ok\n" if alive else b"wedged: a component died or sampling stalled\n",
                "text/plain; charset=utf-8",
            )
        elif path == "/readyz":
            ok = self.server.ready_check()
            self._send(
                200 if ok else 503, b"ok\n" if ok else b"not ready\n", "text/plain; charset=utf-8"
            )
        else:
            self._send(
                404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain; charset=utf-8"
            )

    def _metrics(self) -> None:
        rendered = self.server.body()
        if rendered is None:
            self._send(503, b"no snapshot rendered yet\n", "text/plain; charset=utf-8")
            return
        tail = age_lines(rendered, self.server.clock())
        if "gzip" in self.headers.get("Accept-Encoding", ""):
            # A gzip stream may hold several members; the pre-compressed body plus a tiny
            # member for the age line is a valid stream, so the body is never re-compressed.
            self._send(200, rendered.gzipped + gzip.compress(tail, 1), CONTENT_TYPE, "gzip")
        else:
            self._send(200, rendered.body + tail, CONTENT_TYPE)

    def _send(self, code: int, body: bytes, ctype: str, encoding: str | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        # One line per scrape would drown the agent's log; errors still go through log_error.
        return

    def log_error(self, format: str, *args: object) -> None:
        log.debug("metrics http: " + format, *args)


class MetricsServer:
    """A threaded HTTP(S) server on ``address``; ``start`` binds, ``stop`` closes the socket."""

    def __init__(
        self,
        address: str,
        body: BodySource,
        ready_check: Callable[[], bool],
        *,
        live_check: Callable[[], bool] = lambda: True,
        tls: TlsFiles | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.host, self.port = parse_address(address)
        self._body = body
        self._ready_check = ready_check
        self._live_check = live_check
        self._tls = tls
        self._clock = clock
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve on a background thread. Raises OSError when the port is taken."""
        tls_ctx = self._tls.context() if self._tls is not None else None
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server_cls = type("_BoundServer", (_Server,), {"address_family": family})
        httpd: _Server = server_cls((self.host, self.port), _Handler)
        httpd.body = self._body
        httpd.ready_check = self._ready_check
        httpd.live_check = self._live_check
        httpd.tls = tls_ctx
        httpd.clock = self._clock
        self.port = httpd.server_address[1]  # the real port when 0 asked for a free one
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="nodeagent-http",
            daemon=True,
        )
        self._thread.start()
        scheme = "https" if tls_ctx else "http"
        log.info("serving metrics on %s://%s:%d/metrics", scheme, self.host or "*", self.port)

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
