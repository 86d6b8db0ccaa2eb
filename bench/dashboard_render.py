"""The dashboard with a large run and a full store, in Chromium (figures in
bench/HISTORY.md, "The dashboard with a large run").

Creates, in a scratch SQLite store, ``--runs`` finished runs and one run of about
``--records`` records (a loop node visited ``records / 4`` times: node.started,
node.completed, edge.taken per visit), serves them (``interlock serve``, loopback) and
measures in Debian's Chromium (Playwright):

- runs list: from navigation to the first page's 100 rows drawn; then "older →" to
  the next page's rows; then a search by an input field to its rows;
- run page: from navigation to every record's timeline row drawn and the stream closed
  (the records arrive over the event stream); then interactive: a click on the loop
  node to its visits and messages drawn in the inspector; a click on a timeline row to
  its record shown; "State at record" to the fold at that record shown.

Medians of ``--trials`` page loads, in milliseconds. Measured, not asserted: timings on
a shared machine are noisy.

    python bench/dashboard_render.py [--records 10000] [--runs 2000] [--trials 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _serve import served
from playwright.sync_api import expect, sync_playwright

NODES = "def tick(state):\n    return {'i': state['i'] + 1}\n"


def fill(root: Path, records: int, runs: int) -> None:
    sys.path.insert(0, str(root))
    import interlock

    visits = max(1, records // 4)  # node.started, node.completed, edge.taken x2
    big = interlock.load({
        "workflow": "looped", "input": ["i"], "limits": {"steps": visits + 10},
        "nodes": {"tick": "rnodes:tick"},
        "edges": [{"from": "START", "to": "tick"},
                  {"from": "tick", "to": "tick", "when": f"i < {visits}"},
                  {"from": "tick", "to": "END", "when": f"i >= {visits}"}]})
    small = interlock.load({"workflow": "small", "input": ["n", "team"],
                            "nodes": {"tick": "rnodes:tick"},
                            "edges": [{"from": "START", "to": "tick"},
                                      {"from": "tick", "to": "END"}]})

    async def go() -> None:
        st = interlock.open_store(f"sqlite:///{root / 'runs.db'}")
        try:
            for n in range(runs):
                await small.run({"i": 0, "n": n, "team": "ab"[n % 2]}, store=st,
                                run_id=f"small-{n:05d}")
            await big.run({"i": 0}, store=st, run_id="big")
        finally:
            await st.close()

    asyncio.run(go())


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def trial(page: Any, url: str, records: int, runs: int) -> dict[str, float]:
    out: dict[str, float] = {}
    rows = page.locator("#runs tr")
    t0 = time.perf_counter()
    page.goto(url + "/")
    expect(rows).to_have_count(100, timeout=120_000)
    out["runs list: first page"] = ms(t0)
    t0 = time.perf_counter()
    page.get_by_role("link", name="older →").click()
    expect(page.locator("#runs-footer")).to_contain_text("runs 101–200", timeout=120_000)
    out["runs list: older page"] = ms(t0)
    t0 = time.perf_counter()
    page.locator("#filter-input").fill(f"n={runs // 2}")
    page.locator("#search-runs").click()
    expect(rows).to_have_count(1, timeout=120_000)
    out["runs list: input search"] = ms(t0)

    t0 = time.perf_counter()
    page.goto(url + "/runs/big")
    expect(page.locator("#stream-state")).to_have_attribute("data-state", "closed",
                                                            timeout=600_000)
    expect(page.locator("#timeline tr")).to_have_count(records, timeout=600_000)
    out[f"run page: {records} records drawn"] = ms(t0)
    t0 = time.perf_counter()
    page.locator('svg.graph [data-node="tick"]').click()
    expect(page.locator("#inspector section.visit").first).to_be_visible(
        timeout=600_000)
    out["run page: node's visits shown"] = ms(t0)
    mid = records // 2
    t0 = time.perf_counter()
    page.locator(f'#timeline tr[data-seq="{mid}"]').click()
    expect(page.locator(f'#timeline tr[data-seq="{mid}"] pre.record')).to_be_visible()
    out["run page: a record opened"] = ms(t0)
    t0 = time.perf_counter()
    page.locator("#show-state").click()
    expect(page.locator("#state-title")).to_have_text(f"State after record {mid}",
                                                      timeout=120_000)
    out["run page: state at a record"] = ms(t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dash-render-"))
    (root / "rnodes.py").write_text(NODES)
    (root / "flows").mkdir()
    t0 = time.perf_counter()
    fill(root, args.records, args.runs)
    import interlock

    records = len(asyncio.run(interlock.trace("big", store=f"sqlite:///{root / 'runs.db'}")))
    print(f"store: {args.runs} runs + one of {records} records "
          f"({time.perf_counter() - t0:.0f} s to create)")
    results: dict[str, list[float]] = {}
    with served(root, "--store", f"sqlite:///{root / 'runs.db'}", "--allow-empty") as url, \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                     args=["--no-sandbox"])
        for _ in range(args.trials):
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            for k, v in trial(page, url, records, args.runs).items():
                results.setdefault(k, []).append(v)
            page.close()
        browser.close()
    for k, v in results.items():
        print(f"{k:38s} median {statistics.median(v):8.0f} ms  (trials: "
              f"{', '.join(f'{x:.0f}' for x in v)})")


if __name__ == "__main__":
    main()
