"""`Builder`: the methods of `Workflow` that collect a definition in Python.

Each method adds what a file would declare -- a node (a function, an approval gate, an
agent), an edge in each of its forms -- to a plain mapping in the file's shape, which
`Workflow.spec` parses into a `WorkflowSpec` exactly as a file is parsed; that is what
makes a built workflow and a loaded one equal when they declare the same. The Python
functions given are kept apart, by the ``module:function`` path the definition names
them with. Once the definition is parsed (validated, run) the builder is frozen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Self, TypedDict, TypeVar, overload

from ._definition._model import WorkflowSpec
from ._errors import UsageError

if TYPE_CHECKING:
    from .agents import ScriptedProvider

F = TypeVar("F", bound=Callable[..., object])
# a tool of an agent node: its function, or (function, {"confirm": True})
Tool = Callable[..., object] | tuple[Callable[..., object], Mapping[str, object]]


class Draft(TypedDict, total=False):
    """A definition being built, in the file's shape (what `parse` reads). Its parts are
    user data until parsed (the models check them), hence ``object``."""

    workflow: str
    description: str
    config: dict[str, object]
    input: list[str]
    state: dict[str, dict[str, object]]
    limits: dict[str, object]
    nodes: dict[str, dict[str, object]]
    edges: list[dict[str, object]]


class Builder:
    """The builder half of `Workflow` (its docstring lists the methods): a definition in
    the file's shape (``_data``) and the functions it names (``_callables``)."""

    _data: Draft
    _callables: dict[str, Callable[..., object]]
    _spec: WorkflowSpec | None

    def __init__(self, name: str, *, description: str = "",
                 config: Mapping[str, object] | None = None, input: Iterable[str] = (),
                 state: Mapping[str, str | Mapping[str, object]] | None = None,
                 limits: Mapping[str, object] | None = None) -> None:
        self._data = {
            "workflow": name, "description": description, "config": dict(config or {}),
            "input": list(input),
            "state": {k: dict(v) if isinstance(v, Mapping) else {"reducer": v}
                      for k, v in (state or {}).items()},
            "limits": dict(limits or {}), "nodes": {}, "edges": [],
        }
        self._callables = {}
        self._spec = None

    @property
    def name(self) -> str:
        return str(self._spec.workflow if self._spec is not None else self._data["workflow"])

    def _mutable(self) -> Draft:
        if self._spec is not None:
            raise UsageError(f"workflow {self.name!r} is already validated (it has been run or "
                             "validated); build a new Workflow to change it")
        return self._data

    def _register(self, fn: Callable[..., object]) -> str:
        if not callable(fn):
            raise UsageError(f"expected a function, got {type(fn).__name__}")
        path = _call_path(fn)
        base, n = path, 1
        while path in self._callables and self._callables[path] is not fn:
            n += 1
            path = f"{base}#{n}"
        self._callables[path] = fn
        return path

    @overload
    def node(self, name: str | None = None, fn: None = None, **options: object
             ) -> Callable[[F], F]: ...
    @overload
    def node(self, name: str | None, fn: Callable[..., object], **options: object) -> Self: ...
    @overload
    def node(self, name: Callable[..., object], fn: None = None, **options: object
             ) -> Self: ...
    @overload
    def node(self, name: str | None = None, *, fn: Callable[..., object], **options: object
             ) -> Self: ...

    def node(self, name: str | Callable[..., object] | None = None,
             fn: Callable[..., object] | None = None, **options: object
             ) -> Self | Callable[[F], F]:
        """Add a function node: ``wf.node("rca", rca_fn, reads=[...])`` or as a decorator,
        ``@wf.node()`` / ``@wf.node("name", timeout="30s")``. Options are the file's node
        keys: reads, writes, timeout, retry, isolation, memory, executor, resources, tokens,
        confirm, description, args (``ctx.args``: one function can serve several nodes)."""
        if callable(name):
            return self.node(None, name, **options)
        node_name_given = name

        def add(f: F) -> F:
            node_name = node_name_given or getattr(f, "__name__", None)
            if not node_name:
                raise UsageError("name the node: wf.node('name', fn)")
            data = self._mutable()
            if node_name in data["nodes"]:
                raise UsageError(f"node {node_name!r} is already defined")
            data["nodes"][node_name] = {"call": self._register(f), **node_options(options)}
            return f

        if fn is not None:
            add(fn)
            return self
        return add

    def approval(self, name: str, *, show: Iterable[str] = (), on_modify: Iterable[str] = (),
                 approvers: Iterable[str] = (), timeout: float | str | None = None,
                 on_timeout: str = "reject", input: Mapping[str, object] | None = None,
                 **options: object) -> Self:
        """Add a human approval gate. ``input``: a JSON Schema that a decision's
        ``data`` must satisfy (``approve(data=...)``); the gate's record carries it."""
        data = self._mutable()
        spec: dict[str, object] = {"show": list(show), "on_modify": list(on_modify),
                                "approvers": list(approvers), "on_timeout": on_timeout}
        if timeout is not None:
            spec["timeout"] = timeout
        if input is not None:
            spec["input"] = dict(input)
        data["nodes"][name] = {"approval": spec, **node_options(options)}
        return self

    def agent(self, name: str, *, prompt: str, model: str | None = None,
              system: str | None = None, output: Mapping[str, object] | type | None = None,
              tools: Iterable[Tool] = (), provider: str | ScriptedProvider = "openai",
              base_url: str | None = None, api_key_env: str | None = None,
              output_key: str | None = None, choose: str | None = None,
              max_turns: int | None = None, redact: Iterable[str] = (),
              temperature: float | None = None, tool_errors: str | None = None,
              **options: object) -> Self:
        """Add an LLM agent node. ``output`` is a JSON Schema or a pydantic model
        class; ``tools`` are typed functions, or ``(fn, {"confirm": True})`` for a tool a
        human confirms before it runs; ``provider`` is ``"openai"`` (any OpenAI-compatible
        endpoint) or an ``interlock.testing.ScriptedProvider``; ``tool_errors``: ``"return"``
        (a tool's exception goes back to the model, the default) or ``"raise"`` (it fails
        the node). A tool may return ``interlock.goto(target)`` to hand off to one of the
        node's ``choose`` targets. Other options are the node
        keys of `node` (reads, writes, timeout, retry, tokens, confirm, description)."""
        from .agents import ScriptedProvider

        spec: dict[str, object] = {"prompt": prompt}
        if isinstance(provider, ScriptedProvider):
            spec["provider"] = "scripted"
            spec["replies"] = [[dict(x) for x in r] if isinstance(r, list) else dict(r)
                               for r in provider.replies]
        elif provider in ("openai", "scripted"):
            spec["provider"] = provider
        else:
            raise UsageError(f"provider must be 'openai' or a ScriptedProvider, got {provider!r}")
        spec.update(self._agent_output(output))
        entries = self._tool_entries(tools)
        if entries:
            spec["tools"] = entries
        if redact:
            spec["redact"] = list(redact)
        for key, value in (("model", model), ("system", system), ("base_url", base_url),
                           ("api_key_env", api_key_env), ("output_key", output_key),
                           ("choose", choose), ("max_turns", max_turns),
                           ("temperature", temperature), ("tool_errors", tool_errors)):
            if value is not None:
                spec[key] = value
        data = self._mutable()
        if name in data["nodes"]:
            raise UsageError(f"node {name!r} is already defined")
        data["nodes"][name] = {"agent": spec, **node_options(options)}
        return self

    def _agent_output(self, output: Mapping[str, object] | type | None) -> dict[str, object]:
        """An agent's ``output`` spec keys: a JSON Schema, or a pydantic model's schema and
        the model's registered path."""
        if isinstance(output, type):
            from pydantic import BaseModel

            if not issubclass(output, BaseModel):
                raise UsageError(f"output must be a JSON Schema (a dict) or a pydantic model "
                                 f"class, got {output.__name__}")
            return {"output": output.model_json_schema(), "output_model": self._register(output)}
        return {} if output is None else {"output": dict(output)}

    def _tool_entries(self, tools: Iterable[Tool]) -> list[object]:
        """An agent's ``tools`` spec: each function registered, ``{"call", "confirm"}`` for
        a tool a human confirms."""
        entries: list[object] = []
        for tool in tools:
            fn, opts = tool if isinstance(tool, tuple) else (tool, {})
            unknown = set(opts) - {"confirm"}
            if unknown:
                raise UsageError(f"unknown tool option(s) {sorted(unknown)}; a tool takes "
                                 "(fn, {'confirm': True})")
            path = self._register(fn)
            entries.append({"call": path, "confirm": True} if opts.get("confirm") else path)
        return entries

    def edge(self, source: str | Iterable[str], target: str | Iterable[str], *,
             when: str | None = None, otherwise: bool = False,
             max: int | None = None,
             on_error: bool | str | Iterable[str] = False) -> Self:
        """``a -> b``; a list target is a fan-out, a list source a join. ``on_error``
        (True, or exception class names): an error edge, taken when ``a`` fails."""
        e: dict[str, object] = {"from": _names(source), "to": _names(target)}
        if on_error is not False:
            e["on_error"] = on_error if isinstance(on_error, bool | str) else list(on_error)
        if when is not None:
            e["when"] = when
        if otherwise:
            e["otherwise"] = True
        if max is not None:
            e["max"] = max
        self._mutable()["edges"].append(e)
        return self

    def switch(self, source: str, expr: str, cases: Mapping[Any, str], *,  # keys: any scalar
               default: str | None = None, max: int | None = None) -> Self:
        """Route to one target by the value of a CEL expression."""
        e: dict[str, object] = {"from": source, "switch": expr, "cases": dict(cases)}
        if default is not None:
            e["default"] = default
        if max is not None:
            e["max"] = max
        self._mutable()["edges"].append(e)
        return self

    def router(self, source: str, fn: Callable[..., object], to: Iterable[str], *,
               max: int | None = None) -> Self:
        """Route with a Python function returning one or more of ``to`` (or END)."""
        e: dict[str, object] = {"from": source, "router": self._register(fn), "to": list(to)}
        if max is not None:
            e["max"] = max
        self._mutable()["edges"].append(e)
        return self

    def choose(self, source: str, targets: Iterable[str], *, max: int | None = None) -> Self:
        """Let ``source`` pick its successor by returning ``interlock.goto(name)``."""
        e: dict[str, object] = {"from": source, "choose": list(targets)}
        if max is not None:
            e["max"] = max
        self._mutable()["edges"].append(e)
        return self

    def map(self, source: str, expr: str, target: str, *, as_: str | None = None,
            collect: str | None = None, max_concurrency: int | None = None,
            max_items: int | None = None, max: int | None = None) -> Self:
        """Run ``target`` once per item of the list the CEL expression ``expr`` gives when
        ``source`` completes, concurrently; the item is the field ``as_`` (default
        ``item``) of the state each visit receives. ``collect``: gather each item's
        update, in item order, into that field (else they merge through reducers)."""
        e: dict[str, object] = {"from": source, "map": expr, "to": target}
        for key, value in (("as", as_), ("collect", collect),
                           ("max_concurrency", max_concurrency), ("max_items", max_items),
                           ("max", max)):
            if value is not None:
                e[key] = value
        self._mutable()["edges"].append(e)
        return self


def _call_path(fn: Callable[..., object]) -> str:
    module = getattr(fn, "__module__", None) or "__main__"
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "callable")
    return f"{module}:{qual}"


def _names(value: str | Iterable[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def node_options(options: dict[str, object]) -> dict[str, object]:
    """A builder node's keyword options, checked against the file's node keys (None
    values dropped: an option not given)."""
    allowed = {"reads", "writes", "timeout", "retry", "isolation", "memory", "executor",
               "resources", "tokens", "confirm", "description", "args"}
    unknown = set(options) - allowed
    if unknown:
        raise UsageError(f"unknown node option(s) {sorted(unknown)}; the options are "
                         f"{sorted(allowed)}")
    return {k: v for k, v in options.items() if v is not None}
