"""The dashboard's pictures in docs/ (not a benchmark: it lives here beside the other
scripts that drive a served dashboard in Chromium).

Serves the examples (`interlock serve --workflows examples/`) over a scratch SQLite store,
runs the audit example through its gate -- a modify that re-enters at `risk`, then an
approval -- and takes each graph page at 1400x900 in Debian's Chromium:

- docs/dashboard-run.png: that run's page (taken path, re-entry, loop, visit counts);
- docs/dashboard-workflow-audit.png, docs/dashboard-workflow-code-assistant.png,
  docs/dashboard-workflow-triage.png: the workflows' graphs (with the start form);
- docs/dashboard-run-agent.png: the scripted-agent audit's `risk` visit, its messages,
  tokens and cost (a price table for the scripted model);
- docs/dashboard-runs.png, docs/dashboard-schedules.png, docs/dashboard-workers.png: the
  runs list, the schedules and the workers views.

    python bench/dashboard_screenshots.py   # needs the server and examples extras
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import sync_playwright

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SIZE = {"width": 1400, "height": 900}


def wait_for(client: httpx.Client, run_id: str, statuses: set[str]) -> dict[str, Any]:
    """Until the run's status is one of ``statuses`` (read twice a second: a script)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            run: dict[str, Any] = client.get(f"/api/runs/{run_id}").json()
        except httpx.TransportError:  # a connection closed while the machine is loaded
            time.sleep(0.5)
            continue
        if run["status"] in statuses:
            return run
        time.sleep(0.5)
    raise SystemExit(f"run {run_id} did not reach {statuses}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        prices = Path(tmp) / "prices.yaml"  # an example table: the scripted "model"
        prices.write_text("scripted: {input: 0.15, output: 0.60}\n")
        proc = subprocess.Popen(
            [sys.executable, "-m", "interlock", "serve", "--port", "0", "--store",
             f"sqlite:///{tmp}/runs.db", "--workflows", "examples/"],
            cwd=REPO, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO), "INTERLOCK_PRICES": str(prices)})
        assert proc.stderr is not None
        url = ""
        for line in proc.stderr:
            if "dashboard: " in line:
                url = line.split("dashboard: ")[1].split()[0].rstrip("/")
                break
        try:
            with httpx.Client(base_url=url, timeout=600) as c:
                engagement = json.loads(
                    (REPO / "examples/audit/engagements/northwind.json").read_text())
                c.post("/api/workflows/audit-engagement/runs",
                       json={"input": engagement, "run_id": "audit-1"}).raise_for_status()
                wait_for(c, "audit-1", {"WAITING_APPROVAL"})
                c.post("/api/runs/audit-1/decisions", json={
                    "decision": "modify", "node": "approval", "by": "alice",
                    "comment": "the related parties were reviewed last month",
                    "patch": {"corrections": {"related_party_transactions": False}},
                }).raise_for_status()
                run = wait_for(c, "audit-1", {"WAITING_APPROVAL", "COMPLETED"})
                if run["status"] == "WAITING_APPROVAL":
                    c.post("/api/runs/audit-1/decisions", json={
                        "decision": "approve", "node": "approval", "by": "alice"}
                    ).raise_for_status()
                wait_for(c, "audit-1", {"COMPLETED", "FAILED", "REJECTED"})
                c.post("/api/workflows/audit-engagement-agents/runs",
                       json={"input": engagement, "run_id": "audit-agent-1"}
                       ).raise_for_status()
                run = wait_for(c, "audit-agent-1", {"WAITING_APPROVAL", "COMPLETED",
                                                    "FAILED"})
                if run["status"] == "WAITING_APPROVAL":
                    c.post("/api/runs/audit-agent-1/decisions", json={
                        "decision": "approve", "node": "approval", "by": "alice"}
                    ).raise_for_status()
                wait_for(c, "audit-agent-1", {"COMPLETED", "FAILED", "REJECTED"})
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                             args=["--no-sandbox"])
                page = browser.new_page(viewport=SIZE)
                shots = [("/runs/audit-1", "dashboard-run.png"),
                         ("/workflows/audit-engagement", "dashboard-workflow-audit.png"),
                         ("/workflows/code-assistant",
                          "dashboard-workflow-code-assistant.png"),
                         ("/workflows/ops-triage", "dashboard-workflow-triage.png")]
                for path, name in shots:
                    page.goto(url + path)
                    page.wait_for_selector("svg.graph [data-node]")
                    if path.startswith("/runs/"):
                        page.wait_for_selector('#stream-state[data-state="closed"]')
                    page.screenshot(path=str(DOCS / name))
                    print(f"docs/{name}")
                page.goto(url + "/runs/audit-agent-1")
                page.wait_for_selector('#stream-state[data-state="closed"]')
                page.locator('svg.graph [data-node="risk"]').click()
                page.wait_for_selector("#inspector .messages")
                page.locator("#inspector").scroll_into_view_if_needed()
                page.screenshot(path=str(DOCS / "dashboard-run-agent.png"))
                print("docs/dashboard-run-agent.png")
                for path, name, ready in [("/", "dashboard-runs.png", "#runs tr"),
                                          ("/schedules", "dashboard-schedules.png",
                                           "#schedules-note"),
                                          ("/workers", "dashboard-workers.png", "#workers")]:
                    page.goto(url + path)
                    page.wait_for_selector(ready, state="attached")
                    page.wait_for_timeout(300)  # a picture, not a test: the poll's paint
                    page.screenshot(path=str(DOCS / name))
                    print(f"docs/{name}")
                browser.close()
        finally:
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    main()
