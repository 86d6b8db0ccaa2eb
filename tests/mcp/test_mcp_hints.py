"""The decide-with hints an MCP answer carries: commands a person can paste where they
are (not where the MCP process runs), one per waiting gate."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from interlock.mcp._local import absolute
from interlock.mcp._tools import decide_hints

GATES = {"node": "legal", "pending": [{"node": "legal"}, {"node": "finance"}]}


def test_a_relative_sqlite_store_is_named_by_its_absolute_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert absolute("sqlite:///mcp.db") == f"sqlite:///{tmp_path.resolve() / 'mcp.db'}"
    assert absolute("sqlite:////srv/runs.db") == "sqlite:////srv/runs.db"
    assert absolute("postgresql://db/x") == "postgresql://db/x"
    hint = decide_hints("r1", GATES, None, f" --store {absolute('sqlite:///mcp.db')}")
    store = shlex.split(str(hint["cli"]))[-1]
    assert os.path.isabs(store[len("sqlite:///"):]), store


def test_each_waiting_gate_gets_its_command_and_a_server_is_named() -> None:
    hint = decide_hints("r1", GATES, "http://ops:8765", " --server http://ops:8765")
    assert hint["cli"] == "interlock resume r1 --gate legal --approve --server http://ops:8765"
    assert hint["gates"] == {
        "legal": "interlock resume r1 --gate legal --approve --server http://ops:8765",
        "finance": "interlock resume r1 --gate finance --approve --server http://ops:8765"}
    one = decide_hints("r1", {"node": "g", "pending": [{"node": "g"}]}, None)
    assert "gates" not in one and one["cli"] == "interlock resume r1 --gate g --approve"
