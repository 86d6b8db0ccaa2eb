"""A decision the API is sent with the asking it answers (``requested_at``: the
dashboard's inbox sends its card's ``since``) decides only that asking: once the gate
was asked again -- here a modify re-entered it -- the decision made on the earlier card
is refused (409, nothing recorded), and one made on the card waiting now is taken."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_server import Served, project, wait_status  # noqa: F401  (the fixture)

pytest.importorskip("fastapi")


@pytest.fixture
def served(project: Path) -> Iterator[Served]:  # noqa: F811
    server = Served(project)
    try:
        yield server
    finally:
        server.stop()


def test_a_decision_made_on_an_earlier_card_is_refused(served: Served) -> None:
    with served.client() as c:
        started = c.post("/api/workflows/gated/runs", json={"input": {"n": 1},
                                                             "run_id": "p1"})
        assert started.status_code == 201, started.text
        wait_status(c, "p1", "WAITING_APPROVAL")
        (card,) = [g for g in c.get("/api/approvals").json() if g["run_id"] == "p1"]
        first = card["since"]
        # the card's modify is taken: the gate is asked again (a new card)
        modified = c.post("/api/runs/p1/decisions", json={
            "decision": "modify", "patch": {"n": 10}, "at": "first", "node": "gate",
            "by": "alice", "requested_at": first})
        assert modified.status_code == 200, modified.text
        run = wait_status(c, "p1", "WAITING_APPROVAL")
        assert run["waiting"]["requested_at"] != first
        seq = len(c.get("/api/runs/p1/records").json())

        # a second click on the earlier card: refused, nothing recorded
        stale = c.post("/api/runs/p1/decisions", json={
            "decision": "approve", "node": "gate", "by": "alice", "requested_at": first})
        assert stale.status_code == 409, stale.text
        assert stale.headers["content-type"].startswith("application/problem+json")
        assert "asked again" in stale.json()["detail"]
        assert len(c.get("/api/runs/p1/records").json()) == seq

        # a pin without its gate is refused (it would decide the oldest gate, unchecked),
        # and a time this gate was never asked at is not called "asked again"
        bare = c.post("/api/runs/p1/decisions", json={
            "decision": "approve", "by": "alice", "requested_at": first})
        assert bare.status_code == 400 and "names its gate too" in bare.json()["detail"]
        later = c.post("/api/runs/p1/decisions", json={
            "decision": "approve", "node": "gate", "by": "alice",
            "requested_at": run["waiting"]["requested_at"] + 3600})
        assert later.status_code == 409
        assert "is not the one waiting" in later.json()["detail"]
        assert "asked again" not in later.json()["detail"]
        assert len(c.get("/api/runs/p1/records").json()) == seq

        # the card waiting now decides
        (card,) = [g for g in c.get("/api/approvals").json() if g["run_id"] == "p1"]
        now = c.post("/api/runs/p1/decisions", json={
            "decision": "approve", "node": "gate", "by": "alice",
            "requested_at": card["since"]})
        assert now.status_code == 200, now.text
        done = wait_status(c, "p1", "COMPLETED")
        assert done["state"]["last"] == (10 + 1) * 2
