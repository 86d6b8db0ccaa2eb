"""What the MCP tests share: a project folder of workflows (the server tests' nodes and
gated flow, a plain flow, a flow with an open gate, a conversation whose second turn
runs a child workflow with a gate), the SDK's client over stdio and over HTTP to a
server, the project's fixtures and its CLI in a process of its own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from _harness import write_auth
from _workflows import triage
from test_server import GATED, NODES, TOKENS, Served, pythonpath

pytest.importorskip("mcp")

LOUD = '''
import os, sys

def first(state):
    # stray output: on stdout, which carries the protocol of `interlock mcp`
    print("a node that prints")
    sys.stdout.flush()
    os.write(1, b"and one that writes to fd 1\\n")
    return {"first": state["n"] + 1}
'''

PLAIN = '''
workflow: plain
description: Adds one to n, then doubles it.
input: [n]
nodes:
  first: mnodes:first
  last: snodes:last
edges:
  - {from: START, to: first}
  - {from: first, to: last}
  - {from: last, to: END}
'''

OPEN_GATE = '''
workflow: asked
input: [n]
nodes:
  first: snodes:first
  gate: {approval: {show: [first]}}
  last: snodes:last
edges:
  - {from: START, to: first}
  - {from: first, to: gate}
  - {from: gate, to: last, when: 'gate.decision == "approved"'}
  - {from: last, to: END}
'''


TALK = '''
workflow: talk
description: The on-call assistant.
chat: assistant
nodes:
  assistant:
    agent:
      provider: scripted
      system: You are the on-call assistant.
      tools:
        - {workflow: ../children/triage.yaml, name: run_triage, description: Sweep a service}
      replies:
        - hi, how can I help?
        - {tool_calls: [{name: run_triage, arguments: {service: db}}]}
        - triage done
        - you are welcome
'''

TRIAGE = triage("cnodes:check")

CHILD_NODES = '''
def check(state):
    return {"checked": state["service"]}
'''


def make_project(root: Path) -> Path:
    (root / "snodes.py").write_text(NODES)
    (root / "mnodes.py").write_text(LOUD)
    (root / "flows").mkdir()
    for name, text in (("gated", GATED), ("plain", PLAIN), ("asked", OPEN_GATE),
                       ("talk", TALK)):
        (root / "flows" / f"{name}.yaml").write_text(textwrap.dedent(text))
    (root / "children").mkdir()  # a conversation's child workflow, not served as a tool
    (root / "children" / "triage.yaml").write_text(textwrap.dedent(TRIAGE))
    (root / "cnodes.py").write_text(CHILD_NODES)
    write_auth(root, TOKENS)
    return root


def stdio_params(root: Path, *args: str) -> object:
    """``interlock mcp`` on the project, a subprocess speaking stdio."""
    from mcp import StdioServerParameters

    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "interlock", "mcp", "--workflows", "flows", "--store",
              f"sqlite:///{root / 'runs.db'}", *args],
        cwd=root, env={**os.environ, "PYTHONPATH": pythonpath(root)})


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`make_project` in ``tmp_path``, with no store or log key from the outside."""
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    return make_project(tmp_path)


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``interlock ARGS`` on the project's store, in a process of its own."""
    return subprocess.run([sys.executable, "-m", "interlock", *args, "--store",
                           f"sqlite:///{root / 'runs.db'}"], cwd=root, text=True,
                          capture_output=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": pythonpath(root)})


@pytest.fixture
def served(project: Path) -> Iterator[Served]:
    """``interlock serve`` over the project, under its tokens (``--auth``)."""
    s = Served(project, "--auth", "auth.yaml")
    yield s
    s.stop()


@contextlib.asynccontextmanager
async def client(served: Served, who: str | None, **kwargs: Any) -> AsyncIterator[Any]:
    """The SDK's client on ``/mcp`` with ``who``'s token (none without ``who``)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {TOKENS[who][0]}"} if who else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http, \
            Client(streamable_http_client(f"{served.url}/mcp", http_client=http),
                   **kwargs) as c:
        yield c
