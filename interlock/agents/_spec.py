"""The ``agent:`` block of a node, as a pydantic model.

`NodeSpec.agent` keeps the block as plain data (it is part of the stored
definition); this model is what validation and the agent node read it with.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from .._definition._model import CALL_RE, RESERVED_NAMES
from .._definition._values import NAME_RE


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _call_path(value: str) -> str:
    if not CALL_RE.match(value):
        raise ValueError(f"expected 'package.module:function', got {value!r}")
    return value


class McpServerSpec(_Strict):
    """``mcp: {url: URL, headers: {...}}`` or ``mcp: {command: [prog, args...]}``.
    A header's ``${VAR}`` is read from the environment when the node connects, so
    a token need not be in the workflow (nor in its stored definition)."""

    url: str | None = Field(default=None, pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)
    command: list[str] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_way(self) -> McpServerSpec:
        if (self.url is None) == (self.command is None):
            raise ValueError("mcp: takes exactly one of url: (streamable HTTP) or command: "
                             "[prog, args...] (a subprocess speaking stdio)")
        if self.headers and self.url is None:
            raise ValueError("mcp: headers: go with url:, not command:")
        return self

    @property
    def address(self) -> str:
        """How the log names the server: its URL, or its command line."""
        return self.url if self.url is not None else " ".join(self.command or ())


class ToolSpec(_Strict):
    """A tool is exactly one of: ``module:fn`` / ``{call: module:fn, confirm: true}``; a
    workflow as a tool ``{workflow: FILE, name, description}`` (a child run per
    call; the file is pinned as ``{file, definition}`` when the workflow is loaded); a
    specialist agent as a tool ``{name, description, agent: {...}}``; or an MCP server's
    tools ``{mcp: {url | command}, tools: [names], confirm: [names], prefix: NAME}``."""

    call: str | None = None
    confirm: bool | list[str] = False
    workflow: str | dict[str, Any] | None = None
    agent: dict[str, Any] | None = None
    mcp: McpServerSpec | None = None
    name: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
    description: str | None = None
    tools: list[str] | None = None  # an MCP server's tools offered (default: all)
    prefix: str | None = Field(default=None, pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        return {"call": data} if isinstance(data, str) else data

    @field_validator("call")
    @classmethod
    def _shape(cls, value: str | None) -> str | None:
        return None if value is None else _call_path(value)

    @model_validator(mode="after")
    def _one_kind(self) -> ToolSpec:
        kinds = [k for k in ("call", "workflow", "agent", "mcp") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("a tool is module:function, {call: module:function, confirm: "
                             "true}, {workflow: FILE, name, description}, {name, "
                             "description, agent: {...}} or {mcp: {url | command}, tools, "
                             "confirm, prefix}: exactly one of call, workflow, agent, mcp"
                             + (f" (this one has {', '.join(kinds)})" if kinds else ""))
        if self.mcp is None and (self.tools is not None or self.prefix is not None):
            raise ValueError("tools: and prefix: choose an MCP server's tools; they go with "
                             "mcp:")
        if self.mcp is not None:
            if self.name is not None or self.description is not None:
                raise ValueError("an MCP server's tools keep their own names and "
                                 "descriptions (choose them with tools:, rename with "
                                 "prefix:); name: and description: go with workflow: or "
                                 "agent:")
            if self.confirm is True:
                raise ValueError("an MCP server's guarded tools are named: confirm: [names]")
            return self
        if isinstance(self.confirm, list):
            raise ValueError("confirm: [names] names an MCP server's tools; a Python tool "
                             "takes confirm: true")
        if self.call is None and self.name is None:
            raise ValueError(f"a {kinds[0]} tool needs name: (what the model calls it)")
        if self.confirm and self.call is None:
            raise ValueError("confirm: true guards a Python tool ({call: ..., confirm: "
                             "true}); a workflow tool's gates are the child workflow's own")
        if isinstance(self.workflow, dict) and not isinstance(
                self.workflow.get("definition"), dict):
            raise ValueError("workflow: is the path of a workflow file (relative to this one)")
        return self

    @property
    def kind(self) -> Literal["call", "workflow", "agent", "mcp"]:
        if self.call is not None:
            return "call"
        if self.mcp is not None:
            return "mcp"
        return "workflow" if self.workflow is not None else "agent"


class ScriptedToolCall(_Strict):
    """A tool call in a scripted reply: ``{name: lookup, arguments: {id: 7}}``."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    id: str | None = None


class ScriptedUsage(_Strict):
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    total_tokens: int | None = Field(default=None, ge=0)


class ScriptedReply(_Strict):
    """One reply of ``provider: scripted``: ``content`` (text or JSON data), optional
    ``tool_calls`` and ``usage``. A bare string is short for ``{content: "..."}``."""

    content: Any = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    usage: ScriptedUsage | None = None

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        return {"content": data} if isinstance(data, str) else data


def _reply_kind(value: Any) -> str:
    return "items" if isinstance(value, list) else "reply"


# a reply, or a list of them: one per item of a mapped node (only the matching form's
# problems are reported)
Reply = Annotated[Annotated[ScriptedReply, Tag("reply")]
                  | Annotated[list[ScriptedReply], Tag("items")],
                  Discriminator(_reply_kind)]


class AgentSpec(_Strict):
    """``agent: {provider, model, base_url, api_key_env, system, prompt, output, output_model,
    output_key, choose, tools, max_turns, replies, redact, temperature, tool_errors,
    history, recall}``."""

    provider: Literal["openai", "scripted"] = "openai"
    model: str | None = Field(default=None, min_length=1)
    base_url: str | None = Field(default=None, min_length=1)
    api_key_env: str | None = Field(default=None, min_length=1)
    system: str | None = None
    prompt: str | None = None  # required, except for a conversation's agent (chat:)
    output: dict[str, Any] | None = None
    output_model: str | None = None
    output_key: str | None = None
    choose: str | None = Field(default=None, min_length=1)
    tools: list[ToolSpec] = Field(default_factory=list)
    max_turns: int = Field(default=4, ge=1, le=100)
    # a list in place of a reply: one reply per item of a mapped node (item i gets entry i)
    replies: list[Reply] | None = None
    redact: list[str] = Field(default_factory=list)
    temperature: float | None = Field(default=None, ge=0, le=2)
    # a tool that raises: its error goes back to the model as the tool's answer (return),
    # or fails the node (raise)
    tool_errors: Literal["return", "raise"] = "return"
    # a conversation's agent: the messages sent to the model per turn, and a
    # recall(query) tool over earlier conversations of the workflow
    history: int = Field(default=50, ge=1, le=100_000)
    recall: bool = False

    @field_validator("output_model")
    @classmethod
    def _model_path(cls, value: str | None) -> str | None:
        return None if value is None else _call_path(value)

    @field_validator("output_key")
    @classmethod
    def _key_name(cls, value: str | None) -> str | None:
        if value is not None and (not NAME_RE.match(value) or value in RESERVED_NAMES):
            raise ValueError(f"output_key {value!r} must be an identifier that is not "
                             f"reserved ({', '.join(sorted(RESERVED_NAMES))})")
        return value

    @model_validator(mode="after")
    def _provider_keys(self) -> AgentSpec:
        if self.provider == "openai":
            if self.model is None:
                raise ValueError("provider 'openai' needs 'model' (e.g. gpt-4o-mini)")
            if self.replies is not None:
                raise ValueError("'replies' belongs to provider: scripted")
        else:
            if self.replies is None:
                raise ValueError("provider 'scripted' needs 'replies: [...]' (one per model "
                                 "call, in order)")
            for key in ("base_url", "api_key_env"):
                if getattr(self, key) is not None:
                    raise ValueError(f"'{key}' belongs to provider: openai")
        if self.choose is not None and self.output is None and self.output_model is None:
            raise ValueError("'choose' routes on a field of the structured output: declare "
                             "'output' (a JSON Schema) too")
        return self

    @property
    def structured(self) -> bool:
        return self.output is not None or self.output_model is not None
