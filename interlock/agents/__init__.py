"""Agent nodes: an LLM agent as a node, with a structured output that drives routing.

    nodes:
      risk:
        reads: [plan]
        agent:
          provider: openai                 # any OpenAI-compatible endpoint | scripted
          model: gpt-4o-mini
          prompt: "Plan: {{ plan }}"
          output: {type: object, properties: {level: {enum: [LOW, HIGH]}}, required: [level]}
          tools: [examples.audit.tools:lookup_control, {call: pkg.mod:delete, confirm: true}]

To the engine an agent node is an async ``fn(state, ctx)`` (`build_agent_node`); the
``agent:`` block is checked by `check_agent` with everything else before a run starts.
The provider SDK, Jinja2 and jsonschema are imported when an agent node is first checked
or run, never by ``import interlock``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._definition._kinds import Checker
from .._definition._model import NodeSpec, WorkflowSpec
from ._check import check_agent
from ._errors import (
    AgentConfigError,
    AgentEnvironmentError,
    AgentError,
    AgentOutputError,
    AgentTurnsError,
    ProviderConnectionError,
    ProviderError,
    ProviderServerError,
    ProviderStatusError,
    ProviderTimeoutError,
    RateLimitError,
    ToolDefinitionError,
    ToolUnavailable,
)
from ._node import build_agent_node
from ._providers import ChatRequest, OpenAIProvider, Provider, Reply, ScriptedProvider, ToolCall
from ._spec import AgentSpec, ScriptedReply, ToolSpec


class AgentKind:
    """The ``agent:`` node kind, as validation and the plan take it
    (`interlock._definition._kinds`)."""

    name = "agent"

    def owns(self, node: NodeSpec) -> bool:
        return node.agent is not None

    def check(self, checker: Checker, name: str, node: NodeSpec) -> None:
        check_agent(checker, name, node)

    def build(self, name: str, node: NodeSpec, *, callables: Mapping[str, Callable[..., Any]],
              workflow: WorkflowSpec) -> Callable[..., Any]:
        assert node.agent is not None
        from ._chat import ChatAgent
        from ._delegates import DelegatingAgent

        # a conversation's agent, or an agent whose tools may be workflows and
        # specialist agents
        cls = ChatAgent if workflow.chat == name else DelegatingAgent
        return build_agent_node(name, node.agent, node, callables=callables, workflow=workflow,
                                agent_class=cls)


KIND = AgentKind()

__all__ = [
    "KIND",
    "AgentConfigError",
    "AgentEnvironmentError",
    "AgentError",
    "AgentKind",
    "AgentOutputError",
    "AgentSpec",
    "AgentTurnsError",
    "ChatRequest",
    "OpenAIProvider",
    "Provider",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderServerError",
    "ProviderStatusError",
    "ProviderTimeoutError",
    "RateLimitError",
    "Reply",
    "ScriptedProvider",
    "ScriptedReply",
    "ToolCall",
    "ToolDefinitionError",
    "ToolSpec",
    "ToolUnavailable",
    "build_agent_node",
    "check_agent",
]
