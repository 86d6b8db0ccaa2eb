"""Test doubles for workflows that use interlock.

`ScriptedProvider` stands in for a model provider: it replays declared replies, one per
model call, in order -- offline, with no key, the same every run::

    from interlock.testing import ScriptedProvider

    wf.agent("risk", prompt="Plan: {{ plan }}", output=Risk, reads=["plan"],
             provider=ScriptedProvider([
                 {"tool_calls": [{"name": "lookup_control", "arguments": {"id": "C-7"}}]},
                 {"content": {"level": "HIGH", "reason": "no control"},
                  "usage": {"prompt_tokens": 120, "completion_tokens": 30}},
             ]))

The file form is ``provider: scripted`` with ``replies: [...]`` in the ``agent:`` block.
"""

from __future__ import annotations

from .agents._providers import ScriptedProvider

__all__ = ["ScriptedProvider"]
