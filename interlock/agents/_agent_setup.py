"""An agent node's parts, made when it first runs: its templates, output schema, tools
and provider; the log fields ``redact:`` hides (`AgentSetup`, the base of `_node._Agent`)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from .._definition._model import NodeSpec
from ._errors import AgentConfigError
from ._providers import OpenAIProvider, Provider, ScriptedProvider
from ._spec import AgentSpec, ToolSpec
from ._tools import Tool, make_tool

if TYPE_CHECKING:
    from jinja2 import Template

    from .._engine._context import Context


REDACTED = "[redacted]"
_REPLY_FIELDS = frozenset({"reply", "tool_calls", "arguments"})  # what a journaled reply holds


def output_schema(spec: AgentSpec, model: type[BaseModel] | None,
                  choices: list[str]) -> dict[str, Any] | None:
    """The schema a reply must satisfy: ``output`` (or the model's), with a ``choose``
    field limited to the declared targets when the schema does not limit it itself."""
    schema = spec.output
    if schema is None and model is not None:
        schema = model.model_json_schema()
    if schema is None:
        return None
    schema = copy.deepcopy(schema)
    field = spec.choose
    props = schema.get("properties")
    if field is not None and isinstance(props, dict):
        fs = props.get(field)
        if isinstance(fs, dict) and "enum" not in fs and "const" not in fs and choices:
            props[field] = {**fs, "enum": list(choices)}
        required = schema.setdefault("required", [])
        if isinstance(required, list) and field not in required:
            required.append(field)
    return schema


def _identity(value: Any) -> Any:
    return value


class AgentSetup:
    """An agent node's set-up (on its first run) and its redaction of log fields."""

    def __init__(self, name: str, spec: AgentSpec, node: NodeSpec,
                 callables: dict[str, Callable[..., Any]], choices: list[str]) -> None:
        self.name = name
        self.spec = spec
        self.node = node
        self.callables = callables
        self.choices = choices
        self.output_key = node.output_field(name) or name
        self.redact = frozenset(spec.redact)
        # a reply may be journaled (and replayed) only when no part of it is redacted
        self.replayable = not (self.redact & _REPLY_FIELDS)
        # MCP servers' tools are listed per visit, on a copy of this agent (`_mcp`)
        self.servers = any(t.mcp is not None for t in spec.tools)
        self.visiting = False
        # a reply streams to a `TOKEN_SINK` when one is set (a conversation's agent)
        self.streams = False
        self._ready = False

    def _resolve(self, path: str) -> Callable[..., Any]:
        fn = self.callables.get(path)
        if fn is None:
            from .._definition._callables import import_callable

            fn = self.callables[path] = import_callable(path)
        return fn

    def _prepare(self) -> None:
        if self._ready:
            return
        from jsonschema import Draft202012Validator

        from ._prompt import compile_template

        spec = self.spec
        try:
            self.system_t: Template | None = (compile_template(spec.system)
                                              if spec.system else None)
            # (a conversation's agent has none: its messages are the user's)
            self.prompt_t: Template = compile_template(spec.prompt or "")
        except Exception as exc:
            raise AgentConfigError(f"node {self.name!r}: invalid template: {exc}") from None
        self.model_cls: type[BaseModel] | None = None
        if spec.output_model is not None:
            cls = self._resolve(spec.output_model)
            if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
                raise AgentConfigError(f"node {self.name!r}: output_model "
                                       f"{spec.output_model} is not a pydantic model")
            self.model_cls = cls
        self.schema = output_schema(spec, self.model_cls, self.choices)
        self.validator = Draft202012Validator(self.schema) if self.schema is not None else None
        tools: dict[str, Tool] = {}
        # tools that are not Python functions: a workflow (a child run per call) or a
        # specialist agent, by name
        self.delegates: dict[str, Any] = {}
        for t in spec.tools:
            if t.mcp is not None:  # an MCP server's tools: listed when a visit starts (_mcp)
                continue
            if t.call is None:
                d = self._delegate(t)
                tools[d.tool.name] = d.tool
                self.delegates[d.tool.name] = d
                continue
            tool = make_tool(self._resolve(t.call), t.confirm is True)
            tools[tool.name] = tool
        self._more_tools(tools)
        self.tools = tools
        self.tool_schemas = [t.schema() for t in tools.values()] or None
        self.provider: Provider
        if spec.provider == "scripted":
            self.provider = ScriptedProvider(
                [x.model_dump(mode="json", exclude_defaults=True) for x in r]
                if isinstance(r, list) else r.model_dump(mode="json", exclude_defaults=True)
                for r in spec.replies or [])
        else:
            self.provider = OpenAIProvider(spec.base_url, spec.api_key_env)
        self.url_t: Template | None = None
        if spec.base_url is not None and "{{" in spec.base_url:
            self.url_t = compile_template(spec.base_url)  # e.g. {{ config.llm_base_url }}
        self._ready = True

    def _delegate(self, tool: ToolSpec) -> Any:
        """A workflow or agent tool (`_delegates.DelegatingAgent` makes them)."""
        raise AgentConfigError(f"node {self.name!r}: tool {tool.name!r} is a workflow or an "
                               "agent, which this agent cannot call")

    def _tool_context(self, ctx: Context, base: dict[str, Any]) -> Any:
        """The context a tool that takes ``ctx`` gets (`_delegates.Scoped`)."""
        raise AgentConfigError(f"node {self.name!r}: tool {base.get('tool')!r} takes ctx, "
                               "which this agent cannot give")

    def _more_tools(self, tools: dict[str, Tool]) -> None:
        """Built-in tools of a kind of agent (a conversation's ``end_conversation``)."""

    def _provider(self, ctx: Context) -> Provider:
        if self.url_t is None:
            return self.provider
        from ._prompt import render

        try:
            url = render(self.url_t, {"config": dict(ctx.config)}).strip()
        except Exception as exc:
            raise AgentConfigError(f"node {self.name!r}: cannot render base_url: {exc}") from None
        return OpenAIProvider(url or None, self.spec.api_key_env)

    def _shown_problem(self, problem: str) -> str:
        """A schema problem as the log may show it (its details quote the reply)."""
        if "reply" in self.redact:
            return "details withheld (redact: reply)"
        return problem

    def _hide(self, fields: dict[str, Any]) -> dict[str, Any]:
        """A log record's fields without the ones ``redact:`` names (``arguments`` covers
        the model's own, ``model_arguments``, beside a human's edit)."""
        return {k: v for k, v in fields.items() if k not in self.redact
                and not (k == "model_arguments" and "arguments" in self.redact)}
