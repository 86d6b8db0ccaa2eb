"""``--server`` pointed a little wrong says exactly what is wrong (review 40, finding 6):
a URL ending in a path gets the path's diagnosis alone (not also "a server of an older
interlock", which sent the reader looking for a version problem); an ``https://`` URL of
a server that speaks plain HTTP is told to use ``http://`` instead of a raw
``[SSL: WRONG_VERSION_NUMBER]``.

A real HTTP server on loopback that answers every request as a FastAPI app answers a
route it has not: 404, ``{"detail": "Not Found"}``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from interlock.cli import cli


class _NoRoute(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"detail": "Not Found"}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def plain() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoRoute)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _status(url: str) -> str:
    result = CliRunner().invoke(cli, ["status", "demo", "--server", url])
    assert result.exit_code == 2, result.output
    return result.output


def test_a_url_with_a_path_is_told_about_the_path_only(plain: int) -> None:
    said = _status(f"http://127.0.0.1:{plain}/api")
    assert f"--server ends in a path, '/api': give the server's base URL, " \
        f"http://127.0.0.1:{plain}" in said
    assert "older interlock" not in said
    # without a path, a route this server lacks may be an older interlock's
    assert "A server of an older interlock lacks some of the routes" in \
        _status(f"http://127.0.0.1:{plain}")


def test_https_to_a_plain_http_server_says_use_http(plain: int) -> None:
    said = _status(f"https://127.0.0.1:{plain}")
    assert f"the server at https://127.0.0.1:{plain} answers plain HTTP, not HTTPS: use " \
        f"--server http://127.0.0.1:{plain}" in said, said
    assert "SSL" not in said
