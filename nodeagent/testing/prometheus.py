"""A real Prometheus server on loopback for integration tests (Debian package ``prometheus``).

:class:`PrometheusServer` starts ``prometheus`` with a temporary config and data directory,
scraping the given targets every ``scrape_interval_s``; :meth:`PrometheusServer.query` reads
the HTTP query API and :meth:`PrometheusServer.wait_for` polls until a check holds.
:class:`MetricsPage` serves a prepared exposition-format page for it to scrape.
"""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def find_prometheus() -> str | None:
    """The ``prometheus`` binary on PATH, or ``None``."""
    return shutil.which("prometheus")


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrometheusError(AssertionError):
    """Prometheus exited, or a check never held."""


class PrometheusServer:
    """One Prometheus process scraping ``targets`` (``host:port``), adding ``target_labels``
    to every series (what a scrape config's relabelling does with the node's name)."""

    def __init__(
        self,
        binary: str,
        workdir: Path,
        targets: Sequence[str],
        *,
        scrape_interval_s: float = 1.0,
        job: str = "nodeagent",
        target_labels: Mapping[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        interval_ms = int(scrape_interval_s * 1000)
        config = workdir / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {interval_ms}ms\n"
            f"  scrape_timeout: {int(interval_ms * 0.9)}ms\n"
            f"scrape_configs:\n  - job_name: {job}\n"
            f"    static_configs:\n      - targets: {json.dumps(list(targets))}\n"
            f"        labels: {json.dumps(dict(target_labels or {}))}\n"
        )
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @property
    def url(self) -> str:
        """The HTTP API's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result vector of an instant query."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback only
            body = json.load(resp)
        if body["status"] != "success":
            raise PrometheusError(f"query {expr!r} failed: {body}")
        return list(body["data"]["result"])

    def wait_for(
        self, expr: str, check: Callable[[list[dict[str, Any]]], bool], timeout_s: float
    ) -> list[dict[str, Any]]:
        """Poll ``expr`` until ``check`` holds; the last result."""
        deadline = time.monotonic() + timeout_s
        last: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited with {self.proc.returncode}")
            try:
                last = self.query(expr)
                if check(last):
                    return last
            except OSError:
                pass  # not listening yet
            time.sleep(0.25)
        raise PrometheusError(f"{expr} never satisfied the check; last result {last}")

    def stop(self) -> None:
        """Terminate (kill after 10 s) and close the log."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class MetricsPage:
    """An HTTP server on loopback serving ``text`` at ``/metrics`` (replaceable any time)."""

    def __init__(self, text: str = "") -> None:
        self.text = text
        page = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = page.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def target(self) -> str:
        """``host:port`` for a scrape config."""
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()
