"""Workflow texts and node modules that several test files run, each written once.

Texts are YAML at column 0 (``textwrap.dedent`` leaves them as they are). Where the
tests differ in a detail that matters to them (the module a node calls, the replies a
scripted agent gives), the text is a function of that detail.
"""

from __future__ import annotations

# -- a conversation whose agent runs a child workflow with a gate ------------------------

RECORD_NODES = """
def record(state):
    return {"checked": state.get("service")}
"""

_TRIAGE = """
workflow: triage
input: [service]
nodes:
  check: {call: "%s"}
  approval: {approval: {show: [checked]}}
edges:
  - {from: START, to: check}
  - {from: check, to: approval}
  - {from: approval, to: END, when: 'approval.decision == "approved"'}
"""


def triage(call: str) -> str:
    """The child workflow ``triage`` (input ``service``): ``check`` calls ``call`` (a
    ``module:function`` returning ``{"checked": ...}``, e.g. `RECORD_NODES`' ``record``),
    then the gate ``approval`` shows ``checked``; the run ends only if it is approved."""
    return _TRIAGE % call


def tool_call(name: str, **arguments: str) -> str:
    """A scripted reply that calls the tool ``name`` with ``arguments``."""
    args = ", ".join(f"{k}: {v}" for k, v in arguments.items())
    return "{tool_calls: [{name: " + name + ", arguments: {" + args + "}}]}"


def run_triage(service: str) -> str:
    """A scripted reply that calls the workflow tool ``run_triage`` for ``service``."""
    return tool_call("run_triage", service=service)


def scripted_chat(workflow: str, agent: str, tools: str, *replies: str) -> str:
    """The conversation ``workflow``: a scripted agent ``agent`` with ``tools`` (a YAML
    flow list) giving ``replies`` in turn (YAML flow items: text, or `tool_call`)."""
    return f"""
workflow: {workflow}
chat: {agent}
nodes:
  {agent}:
    agent:
      provider: scripted
      tools: {tools}
      replies:
""" + "".join(f"        - {r}\n" for r in replies)


def toolchat(*replies: str) -> str:
    """The conversation ``toolchat``: a scripted agent ``assistant`` whose tool
    ``run_triage`` runs ``triage.yaml`` (beside it) as a child; its first reply calls the
    tool for ``db``, then it gives ``replies``."""
    return scripted_chat(
        "toolchat", "assistant",
        "[{workflow: triage.yaml, name: run_triage, description: Sweep a service}]",
        run_triage("db"), *replies)


def kchat(tools: str, *replies: str) -> str:
    """The conversation ``kchat``: a scripted agent ``a`` with ``tools``, giving
    ``replies`` in turn (`scripted_chat`)."""
    return scripted_chat("kchat", "a", tools, *replies)


def openai_chat(workflow: str, line: str) -> str:
    """The conversation ``workflow``: an agent ``assistant`` of the model ``gpt-test``
    (provider ``openai``: the local fake of tests/fake_openai.py), with one more line of
    its settings (its ``system:`` or its ``tools:``)."""
    return f"""
workflow: {workflow}
chat: assistant
nodes:
  assistant:
    agent:
      provider: openai
      model: gpt-test
      {line}
"""


OPENAI_CHAT = openai_chat("chat", "system: You are the on-call assistant.")


# -- two gates in parallel branches, one of them followed by a node ----------------------

_DETACHED = """
workflow: detached
nodes:
  prep: %(mod)s:prep
  legal: {approval: {show: []}}
  security: {approval: {show: []}}
  after_legal: %(mod)s:after_legal
edges:
  - {from: START, to: prep}
  - {from: prep, to: [legal, security]}
  - {from: legal, to: after_legal}
  - {from: after_legal, to: END}
  - {from: security, to: END}
"""


def detached(mod: str) -> str:
    """The workflow ``detached``: ``prep`` (of node module ``mod``), then the gates
    ``legal`` and ``security`` in parallel; ``legal``'s branch goes on to ``after_legal``."""
    return _DETACHED % {"mod": mod}


# -- an action whose process dies in the middle of it: an unknown outcome ----------------

ONODES = '''
import os, signal

def fix(state):
    with open("fix.log", "a") as f:
        f.write("fix\\n")
    if os.path.exists("kill.me"):  # the process dies in the middle of the action
        os.remove("kill.me")
        os.kill(os.getpid(), signal.SIGKILL)
    return {"fixed": True}
'''
"""The node module ``onodes``: ``fix`` appends a line to ``fix.log``; while a file
``kill.me`` exists it removes it and SIGKILLs its own process (a real killed process)."""

ONE = """
workflow: one
input: [disk]
nodes: {fix: {call: "onodes:fix", confirm: true, reads: [disk]}}
edges: [{from: START, to: fix}, {from: fix, to: END}]
"""
"""The workflow ``one``: ``fix`` of `ONODES`, an action that asks first (``confirm``)."""


_ONE_GATE = """
workflow: %s
nodes:
  gate: {approval: {show: []}}
edges:
  - {from: START, to: gate}
"""


def one_gate(workflow: str) -> str:
    """The workflow ``workflow``: the gate ``gate`` (it shows nothing), and nothing else."""
    return _ONE_GATE % workflow


# -- the smallest run: one node ----------------------------------------------------------

TINY_NODES = """
def a(state):
    return {"x": state.get("x", 0) + 1}
"""

_TINY = """\
workflow: tiny
nodes:
  a: %s:a
edges:
  - {from: START, to: a}
  - {from: a, to: END}
"""


def tiny(mod: str) -> str:
    """The workflow ``tiny``: the node ``a`` of the module ``mod`` (`TINY_NODES`)."""
    return _TINY % mod


# -- a gate between two nodes, and the version deployed after it -------------------------

_GATED_DOUBLE = """
workflow: %(workflow)s
nodes:
  a: %(mod)s:first
  gate: {approval: {show: [x]}}
  b: %(after)s:double
edges:
  - {from: START, to: a}
  - {from: a, to: gate}
  - {from: gate, to: b, when: 'gate.decision == "approved"'}
  - {from: gate, to: END, otherwise: true}
  - {from: b, to: END}
"""


def gated_double(mod: str, after: str | None = None, workflow: str = "gated") -> str:
    """The workflow ``gated`` (or ``workflow``): ``a`` (``first`` of the node module
    ``mod``), the gate ``gate``, then -- approved -- ``b`` (``double`` of ``after``,
    or of ``mod``); rejected, the end."""
    return _GATED_DOUBLE % {"mod": mod, "after": after or mod, "workflow": workflow}


def with_check(gated: str, mod: str, check: str | None = None) -> str:
    """`gated_double` (its ``b`` of the module ``mod``) deployed again: a node ``c``
    (``check`` of the module ``check``, or of ``mod``) between the gate and ``b`` (so the
    edges after the gate renumber)."""
    return gated.replace(f"  b: {mod}:double",
                         f"  c: {check or mod}:check\n  b: {mod}:double") \
        .replace("{from: gate, to: b,", "{from: gate, to: c,") \
        .replace("  - {from: b, to: END}", "  - {from: c, to: b}\n  - {from: b, to: END}")
