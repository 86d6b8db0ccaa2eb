"""Commit-to-screen latency of the dashboard's run page (docs/server.md, "Dashboard").

Starts ``interlock serve`` on a loopback port over a SQLite store and opens a run's page
in Chromium (Playwright, Debian's ``/usr/bin/chromium``) while the run's first node
waits; then lets the run go (N nodes, each sleeping ``--gap`` seconds) and takes, for
each record, the time its timeline row appeared in the page (a MutationObserver the
benchmark injects) minus the record's ``at`` (sealed just before its commit;
``node.started`` is left out, as in bench/sse_latency.py: it is committed with the
completion). Once for a run the server executes, once for ``interlock run`` in another
process (found by polling). Prints the median and p99 in milliseconds.

    python bench/dashboard_latency.py [--nodes 40] [--gap 0.05] [--poll 0.25]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from _serve import served
from playwright.sync_api import expect, sync_playwright
from sse_latency import arguments, quantiles

OBSERVE = """
window.__seen = {};
new MutationObserver((changes) => {
  const now = Date.now();
  for (const change of changes) for (const node of change.addedNodes) {
    if (node.dataset && node.dataset.seq && !(node.dataset.seq in window.__seen)) {
      window.__seen[node.dataset.seq] = now;
    }
  }
}).observe(document, { childList: true, subtree: true });
"""


def measure(page: Any, url: str, run_id: str, release: Path) -> list[float]:
    page.goto(f"{url}/runs/{run_id}")
    state = page.locator("#stream-state")
    expect(state).to_have_attribute("data-state", "open")
    release.write_text("go")
    expect(state).to_have_attribute("data-state", "closed", timeout=120_000)
    seen = page.evaluate("window.__seen")
    with httpx.Client(base_url=url) as c:
        records = c.get(f"/api/runs/{run_id}/records").json()
    gone = release.stat().st_mtime
    return [seen[str(r["seq"])] / 1000 - r["at"] for r in records
            if r["type"] != "node.started" and r["at"] > gone and str(r["seq"]) in seen]


def main() -> None:
    args = arguments()
    root = Path(tempfile.mkdtemp(prefix="dash-bench-"))
    (root / "bnodes.py").write_text(
        "import os, time\n"
        "def hold(state):\n"
        "    while not os.path.exists(state['release']):\n        time.sleep(0.01)\n"
        "    return {}\n"
        f"def step(state):\n    time.sleep({args.gap})\n    return {{}}\n")
    nodes = "\n".join(f"  n{i}: bnodes:step" for i in range(args.nodes))
    edges = "\n".join(f"  - {{from: {'hold' if i == 0 else f'n{i - 1}'}, to: n{i}}}"
                      for i in range(args.nodes))
    (root / "chain.yaml").write_text(
        f"workflow: chain\ninput: [release]\nnodes:\n  hold: bnodes:hold\n{nodes}\n"
        f"edges:\n  - {{from: START, to: hold}}\n{edges}\n"
        f"  - {{from: n{args.nodes - 1}, to: END}}\n")
    store = f"sqlite:///{root / 'runs.db'}"
    with served(root, "--store", store, "--workflows", "chain.yaml", "--poll",
                str(args.poll)) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page()
        page.add_init_script(OBSERVE)
        with httpx.Client(base_url=url) as c:
            c.post("/api/workflows/chain/runs",
                   json={"run_id": "own", "input": {"release": str(root / "own.go")}})
        own = measure(page, url, "own", root / "own.go")
        cli = subprocess.Popen(
            [sys.executable, "-m", "interlock", "run", "chain.yaml", "--run-id", "other",
             "--store", store, "--input", f'{{"release": "{root / "other.go"}"}}'],
            cwd=root, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(root), os.environ.get("PYTHONPATH", "")])},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with httpx.Client(base_url=url) as c:
            while c.get("/api/runs/other").status_code == 404:
                page.wait_for_timeout(10)
        other = measure(page, url, "other", root / "other.go")
        cli.wait()
        browser.close()
    print(f"run in the server:        {quantiles(own)}")
    print(f"run by another process:   {quantiles(other)}  (poll {args.poll}s)")


if __name__ == "__main__":
    main()
