"""An idle worker picks up a run another process recorded when the store tells of it
(SQLite: the change detector on ``PRAGMA data_version``; PostgreSQL: ``LISTEN``), not
at its next poll: the workers here poll once a minute, the runs must be finished well
before (issue 34)."""

from __future__ import annotations

from pathlib import Path

from test_store_conformance import pg_schema_url  # noqa: F401 (a fixture)
from test_workers import Worker, cli, project, store_url  # noqa: F401 (fixtures)

SLOW_POLL = "60"  # seconds: a run found by polling would miss every wait below


def test_an_idle_worker_picks_up_runs_another_process_records(project: Path,  # noqa: F811
                                                              store_url: str  # noqa: F811
                                                              ) -> None:
    # (on SQLite the file does not exist yet when the worker starts: the first run
    # creates it, and its appearance is a change too)
    worker = Worker(project, store_url, "--poll", SLOW_POLL)
    try:
        for rid in ("p1", "p2"):  # into a new file, then into an existing one
            done = cli(project, "run", "--detach", "flows/chain.yaml", "--input",
                       '{"n": 1}', "--store", store_url, "--run-id", rid)
            assert done.returncode == 0, done.stderr
            worker.wait_for(f"finished run {rid} (workflow chain): COMPLETED", timeout=30)
    finally:
        assert worker.stop() == 0, worker.text
