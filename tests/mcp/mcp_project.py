"""What the MCP tests share: a project folder of workflows (the server tests' nodes and
gated flow, a plain flow, a flow with an open gate, a conversation whose second turn
runs a child workflow with a gate), and the SDK's client over stdio."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from _harness import write_auth
from _workflows import triage
from test_server import GATED, NODES, TOKENS, pythonpath

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
