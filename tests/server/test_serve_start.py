"""``interlock serve`` starting (issue 33): --workflows folders of any content, walked
with their subfolders; no workflow refused unless asked; the workflows and the dashboard's
address said at start; a bad store or a port in use is one line and exit 2 -- before any
run is taken over; /docs is Swagger UI from this server's own files, rendering in Chromium
with every other address blocked.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_server import NODES, Served, pythonpath

pytest.importorskip("fastapi")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    (tmp_path / "snodes.py").write_text(NODES)
    (tmp_path / "examples").symlink_to(EXAMPLES)  # the examples' nodes import from here
    return tmp_path


def serve(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``interlock serve`` that is expected to stop by itself."""
    return subprocess.run([sys.executable, "-m", "interlock", "serve", "--port", "0", *args],
                          cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": pythonpath(root)})


@pytest.mark.parametrize("folder", ["incident", "audit"])
def test_an_example_folder_with_json_array_data_files_is_served(root: Path,
                                                                folder: str) -> None:
    (root / "flows").symlink_to(EXAMPLES / folder)
    served = Served(root)
    try:
        with served.client() as c:
            names = sorted(w["name"] for w in c.get("/api/workflows").json())
        assert names == sorted(f"{n}{s}" for n in [{"incident": "incident-response",
                                                     "audit": "audit-engagement"}[folder]]
                               for s in ("", "-agents", "-openai"))
    finally:
        served.stop()
    said = "".join(served.lines)
    # the data files skipped, said in one line (not a line each: review 40)
    skipped = [line for line in served.lines if "skipped" in line]
    assert len(skipped) == 1, skipped
    assert "--workflows flows: skipped " in skipped[0]
    assert "files that are not a workflow (no top-level workflow: key" in skipped[0]
    assert f"workflows (3): {', '.join(names)}" in said
    assert f"dashboard: {served.url}/" in said
    assert "Traceback" not in said


def test_an_agent_without_its_key_is_said_at_start(root: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``interlock run`` refuses a workflow whose agent has no key; the server executes
    its runs itself, so it says so when it starts -- once per agent node -- and serves."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    (root / "flows").mkdir()
    shutil.copy(EXAMPLES / "incident" / "workflow.openai.yaml", root / "flows" / "ai.yaml")
    shutil.copy(EXAMPLES / "jokes" / "workflow.yaml", root / "flows" / "jokes.yaml")
    served = Served(root)
    try:
        with served.client() as c:
            assert c.get("/api/workflows").status_code == 200
    finally:
        served.stop()
    warned = [line for line in served.lines if "no API key" in line]
    assert [w.split(": node ")[1].split(":")[0] for w in warned] == ["'rca'", "'recommend'"]
    assert all("workflow 'incident-response-openai'" in w and "OPENAI_API_KEY" in w
               for w in warned)
    assert "Traceback" not in "".join(served.lines)


def test_the_examples_folder_is_walked_with_its_subfolders(root: Path) -> None:
    """docs/server.md's own line: `--workflows examples/` serves every example."""
    (root / "flows").symlink_to(EXAMPLES)
    served = Served(root)
    try:
        with served.client() as c:
            names = {w["name"] for w in c.get("/api/workflows").json()}
    finally:
        served.stop()
    expected = {"audit-engagement", "code-assistant", "incident-response", "jokes",
                "ops-triage", "ops-assistant", "ops-assistant-openai", "ops-triage-sweep"}
    files = [*EXAMPLES.glob("*/workflow*.yaml"), *EXAMPLES.glob("triage/assistant*.yaml"),
             EXAMPLES / "triage" / "sweep.yaml"]  # (the on-call assistant and its sweep)
    assert expected <= names and len(names) == len(files)
    assert "--workflows flows: skipped " in "".join(served.lines)


def test_no_workflow_is_refused_unless_asked(root: Path) -> None:
    (root / "data").mkdir()
    (root / "data" / "rows.json").write_text("[1, 2, 3]")
    (root / "data" / "notes.yaml").write_text("just: data\n")
    done = serve(root, "--workflows", "data", "--store", f"sqlite:///{root / 'runs.db'}")
    assert done.returncode == 2, done.stderr
    assert "--workflows data: no workflow found" in done.stderr
    assert "--allow-empty" in done.stderr
    assert "--workflows data: skipped 2 files that are not a workflow (no top-level " \
        "workflow: key; data beside the workflows, say): data/notes.yaml, data/rows.json" \
        in done.stderr
    assert "Traceback" not in done.stderr
    assert not (root / "runs.db").exists()  # nothing was opened
    (root / "flows").symlink_to(root / "data")
    served = Served(root, "--allow-empty")
    try:
        with served.client() as c:
            assert c.get("/api/workflows").json() == []
    finally:
        served.stop()
    assert "workflows (0): none" in "".join(served.lines)


def test_a_bad_store_is_one_line_and_exit_2(root: Path) -> None:
    (root / "flows").mkdir()
    shutil.copy(EXAMPLES / "jokes" / "workflow.yaml", root / "flows" / "jokes.yaml")
    (root / "junk.db").write_bytes(b"not a database at all" * 200)
    (root / "adir").mkdir()
    for store, said in [("bogus://x", "unknown store URL 'bogus://x'"),
                        (f"sqlite:///{root / 'junk.db'}", "is not a SQLite database"),
                        (f"sqlite:///{root / 'adir'}", "adir: it is a directory")]:
        done = serve(root, "--workflows", "flows", "--store", store)
        assert done.returncode == 2, done.stderr  # not uvicorn's 3 ("waiting for approval")
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and said in errors[0], done.stderr
        assert "Traceback" not in done.stderr
        # no "INFO: Started server process" before the error: it did not start (it said so)
        assert "Started server process" not in done.stderr, done.stderr


def test_a_webhook_that_is_not_a_url_is_refused_before_anything_starts(root: Path) -> None:
    """It was accepted, and failed only at the first gate, in the log."""
    (root / "flows").mkdir()
    shutil.copy(EXAMPLES / "jokes" / "workflow.yaml", root / "flows" / "jokes.yaml")
    for flag, url in [("--notify", "hooks.example.com/x"), ("--public-url", "example.com")]:
        done = serve(root, "--workflows", "flows", "--store", f"sqlite:///{root / 'runs.db'}",
                     flag, url)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"error: {flag} '{url}' is not an http:// or https:// "
                                      "URL"), done.stderr
        assert "Started server process" not in done.stderr
    assert not (root / "runs.db").exists()


def test_a_server_that_starts_says_so_once(root: Path) -> None:
    (root / "flows").mkdir()
    shutil.copy(EXAMPLES / "jokes" / "workflow.yaml", root / "flows" / "jokes.yaml")
    served = Served(root)
    try:
        started = [line for line in served.lines if "Started server process" in line]
        assert started == [f"INFO:     Started server process [{served.proc.pid}]\n"]
    finally:
        served.stop()


def test_a_port_in_use_is_one_line_and_exit_2_before_anything_starts(root: Path) -> None:
    (root / "flows").mkdir()
    shutil.copy(EXAMPLES / "jokes" / "workflow.yaml", root / "flows" / "jokes.yaml")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "interlock", "serve", "--port", str(port), "--workflows",
             "flows", "--store", f"sqlite:///{root / 'runs.db'}"], cwd=root,
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": pythonpath(root)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use; another process "
        "listens there: stop it or choose another --port")
    assert "Traceback" not in done.stderr
    # the store was not opened: no run could have been taken over by a server that then
    # could not listen
    assert not (root / "runs.db").exists()


# -- /docs offline, in a browser --------------------------------------------------------


@pytest.fixture
def page(root: Path) -> Iterator[tuple[Served, Any]]:
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="the browser tests need Playwright (the dev extra)")
    chromium = os.environ.get("INTERLOCK_TEST_CHROMIUM") or shutil.which("chromium") \
        or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("no Chromium found (apt-get install chromium, or set "
                    "INTERLOCK_TEST_CHROMIUM)")
    (root / "flows").mkdir()
    shutil.copy(EXAMPLES / "jokes" / "workflow.yaml", root / "flows" / "jokes.yaml")
    served = Served(root)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            yield served, browser.new_page()
            browser.close()
    finally:
        served.stop()


def test_docs_render_with_the_network_blocked(page: tuple[Served, Any]) -> None:
    pytest.importorskip("fastapi_offline", reason="/docs' files come with the server extra")
    served, tab = page
    elsewhere: list[str] = []

    def only_here(route: Any) -> None:
        if route.request.url.startswith(served.url + "/"):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    tab.route("**/*", only_here)
    tab.goto(served.url + "/docs")
    tab.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
    assert "interlock" in tab.inner_text(".swagger-ui .info .title")
    tab.wait_for_selector("#operations-default-workflows_api_workflows_get, "
                          ".opblock-summary-path[data-path='/api/workflows']",
                          timeout=30_000)
    assert elsewhere == []
