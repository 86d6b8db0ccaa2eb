"""Tools: typed Python callables offered to a model.

A tool's parameters become a JSON Schema (through pydantic, from the type hints), and a
model's arguments are validated against them before the function is called -- with
Python values (``int``, a pydantic model, a ``Literal``) as the signature asks.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from ._errors import ToolDefinitionError


class ToolArgumentsError(Exception):
    """The model's arguments do not fit the tool: answered to the model, not fatal."""



def json_object(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the model sent them: a JSON object, or a
    `ToolArgumentsError` the model is told about."""
    try:
        raw = json.loads(arguments or "{}")
    except ValueError as exc:
        raise ToolArgumentsError(f"the arguments are not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ToolArgumentsError(f"the arguments must be a JSON object, got {raw!r}")
    return raw

@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    confirm: bool
    description: str
    args_model: type[BaseModel]
    params: tuple[str, ...]  # parameter names, in order
    parameters: dict[str, Any]  # the JSON Schema of the arguments
    is_async: bool
    # it takes ``ctx`` (a parameter of that name): the node's context, scoped to the call
    # (its run id, config, an idempotency key and `once` keys of the call's own)
    takes_ctx: bool = False

    def schema(self) -> dict[str, Any]:
        """The Chat Completions ``tools`` entry."""
        fn: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            fn["description"] = self.description
        return {"type": "function", "function": fn}

    def parse(self, arguments: str) -> tuple[dict[str, Any], Any]:
        """The model's JSON arguments -> (keyword arguments, the arguments as JSON data)."""
        raw = json_object(arguments)
        try:
            model = self.args_model.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
                for e in exc.errors(include_url=False))
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {problems}") from None
        kwargs = {name: getattr(model, f"p{i}") for i, name in enumerate(self.params)}
        return kwargs, raw

    def origin(self) -> dict[str, Any]:
        """Where the tool lives, for its ``tool.called`` records (an MCP server's name it)."""
        return {}

    async def invoke(self, kwargs: dict[str, Any]) -> Any:
        if self.is_async:
            return await self.fn(**kwargs)
        from .._engine._guards import NODE_THREADS

        call = functools.partial(contextvars.copy_context().run, self.fn, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(NODE_THREADS, call)


def make_tool(fn: Callable[..., Any], confirm: bool = False) -> Tool:
    """Describe ``fn`` as a tool. Raises ToolDefinitionError when it cannot be."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(f"tool {name!r}: cannot read its signature: {exc}") from None
    try:
        target = fn if inspect.isroutine(fn) else type(fn).__call__
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception as exc:  # unresolvable annotations raise NameError and friends
        raise ToolDefinitionError(f"tool {name!r}: cannot resolve its type hints: "
                                  f"{exc}") from None
    fields: dict[str, Any] = {}
    params: list[str] = []
    takes_ctx = False
    for i, p in enumerate(sig.parameters.values()):
        if p.name == "ctx":  # the node's context, as a node gets it: not the model's to pass
            if p.kind is p.POSITIONAL_ONLY or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise ToolDefinitionError(f"tool {name!r}: ctx must be an ordinary "
                                          "parameter (def tool(x: int, ctx): ...)")
            takes_ctx = True
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {name!r}: *{p.name} parameters cannot be offered "
                                      "to a model; name each parameter")
        if p.kind is p.POSITIONAL_ONLY:
            raise ToolDefinitionError(f"tool {name!r}: parameter {p.name!r} is positional-only;"
                                      " a model passes arguments by name")
        if p.name not in hints:
            raise ToolDefinitionError(f"tool {name!r}: parameter {p.name!r} has no type "
                                      "annotation; annotate it so the model knows what to pass")
        default = ... if p.default is p.empty else p.default
        fields[f"p{i}"] = (hints[p.name], Field(default, alias=p.name))
        params.append(p.name)
    try:
        model = create_model(f"{name}_arguments",
                             __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
                             **fields)
        schema = model.model_json_schema(by_alias=True)
    except Exception as exc:  # a type pydantic cannot describe
        raise ToolDefinitionError(f"tool {name!r}: its parameters cannot be described as "
                                  f"JSON Schema: {exc}") from None
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    doc = inspect.getdoc(fn) or ""
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))  # noqa: B004
    return Tool(name, fn, confirm, doc.split("\n\n")[0].strip(), model, tuple(params), schema,
                is_async, takes_ctx)
