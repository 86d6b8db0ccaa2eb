"""The ``agent:`` block of a node (SPEC §6), as a pydantic model.

`NodeSpec.agent` keeps the block as plain data (it is part of the stored
definition); this model is what validation and the agent node read it with.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .._definition._model import CALL_RE, RESERVED_NAMES
from .._definition._values import NAME_RE


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _call_path(value: str) -> str:
    if not CALL_RE.match(value):
        raise ValueError(f"expected 'package.module:function', got {value!r}")
    return value


class McpServerSpec(_Strict):
    """``mcp: {url: URL, headers: {...}}`` or ``mcp: {command: [prog, args...]}`` (SPEC
    §12). A header's ``${VAR}`` is read from the environment when the node connects, so
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
    """``tools: [module:fn, {call: module:fn, confirm: true}]``, or an MCP server's
    tools ``{mcp: {url | command}, tools: [names], confirm: [names], prefix: NAME}``."""

    call: str | None = None
    confirm: bool | list[str] = False
    mcp: McpServerSpec | None = None
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
        if (self.call is None) == (self.mcp is None):
            raise ValueError("a tool is module:function, {call: module:function, confirm: "
                             "true} or {mcp: {url | command}, tools, confirm, prefix}: "
                             "exactly one of call, mcp")
        if self.mcp is None and (self.tools is not None or self.prefix is not None):
            raise ValueError("tools: and prefix: choose an MCP server's tools; they go with "
                             "mcp:")
        if self.mcp is None and isinstance(self.confirm, list):
            raise ValueError("confirm: [names] names an MCP server's tools; a Python tool "
                             "takes confirm: true")
        if self.mcp is not None and isinstance(self.confirm, bool):
            raise ValueError("an MCP server's guarded tools are named: confirm: [names]")
        return self


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


class AgentSpec(_Strict):
    """``agent: {provider, model, base_url, api_key_env, system, prompt, output, output_model,
    output_key, choose, tools, max_turns, replies, redact, temperature, tool_errors}``."""

    provider: Literal["openai", "scripted"] = "openai"
    model: str | None = Field(default=None, min_length=1)
    base_url: str | None = Field(default=None, min_length=1)
    api_key_env: str | None = Field(default=None, min_length=1)
    system: str | None = None
    prompt: str
    output: dict[str, Any] | None = None
    output_model: str | None = None
    output_key: str | None = None
    choose: str | None = Field(default=None, min_length=1)
    tools: list[ToolSpec] = Field(default_factory=list)
    max_turns: int = Field(default=4, ge=1, le=100)
    replies: list[ScriptedReply] | None = None
    redact: list[str] = Field(default_factory=list)
    temperature: float | None = Field(default=None, ge=0, le=2)
    # a tool that raises: its error goes back to the model as the tool's answer (return),
    # or fails the node (raise)
    tool_errors: Literal["return", "raise"] = "return"

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
