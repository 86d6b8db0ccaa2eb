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


def run_triage(service: str) -> str:
    """A scripted reply that calls the workflow tool ``run_triage`` for ``service``."""
    return "{tool_calls: [{name: run_triage, arguments: {service: " + service + "}}]}"


def toolchat(*replies: str) -> str:
    """The conversation ``toolchat``: a scripted agent ``assistant`` whose tool
    ``run_triage`` runs ``triage.yaml`` (beside it) as a child; its first reply calls the
    tool for ``db``, then it gives ``replies`` (YAML flow items: text, or `run_triage`)."""
    return """
workflow: toolchat
chat: assistant
nodes:
  assistant:
    agent:
      provider: scripted
      tools: [{workflow: triage.yaml, name: run_triage, description: Sweep a service}]
      replies:
""" + "".join(f"        - {r}\n" for r in (run_triage("db"), *replies))


OPENAI_CHAT = """
workflow: chat
chat: assistant
nodes:
  assistant:
    agent:
      provider: openai
      model: gpt-test
      system: You are the on-call assistant.
"""


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
