"""``interlock worker --workflows`` says at start which of its workflows' agents have no
API key where it runs (review 40, finding 2: as ``serve`` does): a run of such a
workflow that it takes would fail at that node."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_server import pythonpath
from test_workers import Worker

AI = """\
workflow: ai
nodes:
  rca:
    agent: {provider: openai, model: gpt-test, prompt: hi}
edges:
  - {from: START, to: rca}
  - {from: rca, to: END}
"""


def test_a_worker_says_which_agents_have_no_key_here(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "INTERLOCK_STORE", "INTERLOCK_LOG_KEY"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "ai.yaml").write_text(AI)
    env = {**os.environ, "PYTHONPATH": pythonpath(tmp_path)}
    worker = Worker(tmp_path, f"sqlite:///{tmp_path / 'runs.db'}", "--workflows", "ai.yaml",
                    env=env)
    try:
        worker.wait_for("no API key")
    finally:
        worker.stop()
    [line] = [x for x in worker.lines if "no API key" in x]
    assert line.startswith("interlock worker: warning: workflow 'ai': node 'rca': no API "
                           "key: $OPENAI_API_KEY is not set")
    assert line.rstrip().endswith("a run of it this worker takes fails at that node: set "
                                  "the variable where the worker runs")
