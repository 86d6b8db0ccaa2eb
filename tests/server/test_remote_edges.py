"""The CLI's ``--server`` at its edges: ``verify --server`` (the server verifies the run in
its store, with its own log key), and a --server that is not the base URL of an
``interlock serve`` -- a page that answers 200 with HTML, a URL with a path, a URL
with no scheme -- named with the fix (exit 2), never a traceback."""

from __future__ import annotations

import http.server
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _harness import cli_root
from _workflows import TINY_NODES, tiny
from click.testing import CliRunner, Result
from conftest import record_row
from test_server import Served

pytest.importorskip("fastapi")

from interlock.cli import cli

KEY = "the server's own key"


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return cli_root(tmp_path, monkeypatch, {"renodes_edges": TINY_NODES},
                    {"tiny": tiny("renodes_edges")})


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_verify_through_a_server_is_the_servers_verify(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f"sqlite:///{root / 'runs.db'}"
    flow = str(root / "flows" / "tiny.yaml")
    assert run("run", flow, "--run-id", "keyed", "--store", store,
               env={"INTERLOCK_LOG_KEY": KEY}).exit_code == 0
    assert run("run", flow, "--run-id", "plain", "--store", store).exit_code == 0
    monkeypatch.setenv("INTERLOCK_LOG_KEY", KEY)  # the server's environment, not ours
    served = Served(root)
    monkeypatch.delenv("INTERLOCK_LOG_KEY")
    try:
        ok = run("verify", "keyed", "--server", served.url)
        assert ok.exit_code == 0, ok.output
        assert ok.stdout == (
            "ok: keyed (5 records, keyed chain (HMAC-SHA-256) and fold verified: written "
            f"by a holder of INTERLOCK_LOG_KEY; checked by the server at {served.url})\n")
        with served.client() as c:
            body = c.get("/api/runs/keyed/verify").json()
        assert body == {"run_id": "keyed", "ok": True, "records": 5, "seq": None,
                        "message": "", "keyed": True, "notes": [], "children": [],
                        "located": True, "migrations": []}

        # the server holds a key, the run's log is plain: checked as a plain chain, and
        # not verified as keyed (test_verify_server_key.py)
        plain = run("verify", "plain", "--server", served.url)
        assert plain.exit_code == 1
        assert plain.stdout.startswith("not verified as keyed: plain (")
        assert "plain chain intact, not keyed" in plain.stdout

        with sqlite3.connect(root / "runs.db") as conn:  # someone edits a record
            (data,) = conn.execute(f"SELECT data FROM entries WHERE id = "
                                   f"{record_row('keyed', 4)}").fetchone()
            conn.execute(f"UPDATE entries SET data = ? WHERE id = {record_row('keyed', 4)}",
                         (data.replace('"x":1', '"x":7'),))
        broken = run("verify", "keyed", "--server", served.url)
        assert broken.exit_code == 1
        assert broken.stdout.startswith("broken: keyed at record 4 of 5: ")
        assert f"checked by the server at {served.url}" in broken.stdout

        unknown = run("verify", "nope", "--server", served.url)
        assert unknown.exit_code == 2 and "no run 'nope'" in unknown.stderr
        both = run("verify", "--file", "x.jsonl", "--server", served.url)
        assert both.exit_code == 2 and "not both" in both.stderr
    finally:
        served.stop()


class _Page(http.server.BaseHTTPRequestHandler):
    """What a --server pointed elsewhere reaches: a sign-in page (200, HTML) under
    /sso/, a proxy's 502 page under /down/, a JSON API of something else under /other/."""

    def do_GET(self) -> None:  # (http.server calls it so)
        if self.path.startswith("/down/"):
            self._send(502, "text/html", b"<html>Bad Gateway</html>")
        elif self.path.startswith("/other/"):
            self._send(200, "application/json", b'{"hello": "world"}')
        else:
            self._send(200, "text/html; charset=utf-8", b"<html>Sign in</html>")

    def _send(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def page() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_server_url_that_is_not_interlocks_is_named_with_the_fix(page: str) -> None:
    """It used to be a traceback (JSONDecodeError) for a 200 that is not JSON."""
    for args in (["status", "r1"], ["runs"], ["trace", "r1"], ["verify", "r1"]):
        html = run(*args, "--server", f"{page}/sso")
        assert html.exit_code == 2, (args, html.output)
        assert html.stderr.startswith(f"error: {page}/sso/api/runs")
        assert ("answered 200 with text/html, not interlock's JSON: is --server the base URL "
                "of `interlock serve`") not in html.stderr  # (a path: the path is named)
        assert "--server ends in a path, '/sso': give the server's base URL, " \
               f"{page} (its routes start at /api/...)" in html.stderr
    down = run("status", "r1", "--server", page + "/down")
    assert down.exit_code == 2
    assert f"{page}/down/api/runs/r1 answered 502 with text/html (Bad Gateway), not " \
           "interlock's JSON" in down.stderr
    for args in (["status", "r1"], ["runs"], ["trace", "r1"], ["verify", "r1"]):
        other = run(*args, "--server", page + "/other")  # JSON, not interlock's
        assert other.exit_code == 2, (args, other.output)
        assert other.stderr.startswith(f"error: {page}/other/api/runs"), other.stderr
        assert "answered JSON that is not what interlock sends there" in other.stderr
    root = run("status", "r1", "--server", page)
    assert root.exit_code == 2
    assert root.stderr == (f"error: {page}/api/runs/r1 answered 200 with text/html, not "
                           "interlock's JSON: is --server the base URL of `interlock serve` "
                           "(the address it prints, such as http://127.0.0.1:8765)?\n")


def test_a_server_url_with_a_path_or_no_scheme(root: Path) -> None:
    served = Served(root)
    try:
        with served.client() as c:
            started = c.post("/api/workflows/tiny/runs", json={"input": {}, "run_id": "r1"})
            assert started.status_code in (200, 201), started.text
        deadline = time.monotonic() + 30
        while run("status", "r1", "--server", served.url).exit_code != 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # a path: it used to say only "error: Not Found"
        api = run("status", "r1", "--server", f"{served.url}/api")
        assert api.exit_code == 2
        assert api.stderr.startswith(f"error: {served.url}/api/api/runs/r1 answered 404 Not "
                                     "Found, with no word of interlock's: --server ends in a "
                                     f"path, '/api': give the server's base URL, {served.url}")
        # no scheme on a loopback address: http://, as `interlock serve` prints it
        bare = run("status", "r1", "--server", served.url.removeprefix("http://") + "/")
        assert bare.exit_code == 0, bare.output
        assert json.loads(run("status", "r1", "--json", "--server",
                              served.url.removeprefix("http://")).stdout)["run_id"] == "r1"
    finally:
        served.stop()
    # elsewhere the scheme is asked for (plain http would send a token in clear)
    far = run("status", "r1", "--server", "interlock.example.com:8765")
    assert far.exit_code == 2
    assert far.stderr == ("error: --server 'interlock.example.com:8765' has no scheme: give "
                          "the base URL `interlock serve` answers at, "
                          "https://interlock.example.com:8765 (or "
                          "http://interlock.example.com:8765 on a network you trust: a token "
                          "is sent in clear over http)\n")
