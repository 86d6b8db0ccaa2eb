"""Static checks of an ``agent:`` block, reported like every other diagnostic
(``file:line:col``, located at ``nodes.<name>.agent.<key>``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from .._definition._kinds import Checker
from .._definition._model import NodeSpec, WorkflowSpec
from ._errors import ToolDefinitionError
from ._spec import AgentSpec, McpServerSpec
from ._tools import make_tool


def check_agent(checker: Checker, name: str, ns: NodeSpec) -> None:
    """Check node ``name``'s ``agent:`` block, reporting every problem through ``checker``."""
    assert ns.agent is not None
    where: tuple[Any, ...] = ("nodes", name, "agent")
    spec = _parse(checker, name, ns.agent, where)
    if spec is None:
        return

    def error(message: str, *path: Any) -> None:
        checker.add("error", f"node {name!r}: {message}", (*where, *path), "agent")

    if ns.isolation == "process":
        checker.add("error", f"node {name!r}: an agent node runs in the engine's process; "
                    "'isolation: process' is for call nodes", ("nodes", name, "isolation"),
                    "agent")
    output_key = ns.output_field(name)
    if ns.writes is not None and output_key not in ns.writes:
        checker.add("error", f"node {name!r}: the agent writes its output to {output_key!r}, "
                    "which its 'writes' does not list", ("nodes", name, "writes"), "agent")
    if spec.prompt is None and checker.spec.chat != name:
        error("missing required key 'prompt' (the user message the agent gets; only a "
              "conversation's agent, the node named by chat:, takes its messages instead)")
    if spec.recall and checker.spec.chat != name:
        error("recall: true gives a conversation's agent (the node chat: names) a "
              "recall(query) tool over earlier conversations; this node is not one", "recall")
    if checker.spec.chat == name:
        if spec.prompt is not None:
            error("a conversation's agent takes the user's messages, not a prompt: remove "
                  "prompt (put standing instructions in system)", "prompt")
        hidden = sorted(set(spec.redact) & {"reply", "tool_calls", "arguments"})
        if hidden:
            error(f"redact: {hidden}: a conversation's agent rebuilds each turn from its "
                  "journaled model calls, which a redacted reply is not (every earlier turn "
                  "would call the model again); redact prompt or result only", "redact")
    if checker.spec.chat == name and spec.structured:
        error("a conversation's agent replies in text: remove output/output_model (a "
              "specialist agent used as a tool may declare one)", "output")
    check_key(checker, name, spec, where)
    _check_templates(spec, ns, error)
    schema = _check_output(checker, name, spec, where, error)
    _check_tools(checker, name, spec, where, error)
    _check_choose(checker.spec, name, spec, schema, error)
    if schema is not None and output_key is not None:
        _check_paths(checker, name, output_key, schema)


def check_key(checker: Checker, name: str, spec: AgentSpec, where: tuple[Any, ...],
              tool: str = "") -> None:
    """The variable an ``openai`` agent reads its key from, unset in this process: a
    warning (code ``api-key``) -- the process that executes the run may have it (a worker,
    a server), but ``interlock run`` here would fail at this node, so it refuses to start."""
    var = spec.api_key_env or "OPENAI_API_KEY"
    if spec.provider != "openai" or os.environ.get(var):
        return
    if tool and any(d.code == "api-key" and d.message.startswith(f"node {name!r}: ")
                    and f"${var} " in d.message for d in checker.result.diagnostics):
        return  # said for the node already
    other = "" if spec.api_key_env else " (or name another variable with api_key_env)"
    checker.add("warning", f"node {name!r}: {tool}no API key: ${var} is not set in this "
                f"environment, and this agent reads its key from it; a run executed here "
                f"fails when it reaches {name!r}: export {var}=...{other} -- a local "
                "OpenAI-compatible server accepts any non-empty value",
                (*where, "api_key_env") if spec.api_key_env else where, "api-key")


def check_headers(checker: Checker, name: str, server: McpServerSpec,
                  where: tuple[Any, ...]) -> None:
    """An MCP server's header that reads a ``${VAR}`` unset in this process: `check_key`'s
    rule and code (``api-key``: `validate` warns, a command that would execute the run
    here refuses before recording anything), since the node would fail at it."""
    from ._mcp import _ENV

    for header, value in server.headers.items():
        for var in dict.fromkeys(_ENV.findall(value)):
            if var in os.environ:
                continue
            checker.add("warning", f"node {name!r}: the header {header!r} of the MCP server "
                        f"{server.url} reads ${{{var}}}, which is not set in this "
                        f"environment; a run executed here fails when it reaches {name!r}: "
                        f"export {var}=...", (*where, "headers", header), "api-key")


def _parse(checker: Checker, name: str, data: Any, where: tuple[Any, ...]) -> AgentSpec | None:
    from .._definition._spec import _data_path, unknown_key, valid_keys

    if not isinstance(data, dict):
        checker.add("error", f"node {name!r}: 'agent' must be a mapping (provider, model, "
                    "prompt, output, tools, ...)", where, "agent")
        return None
    try:
        return AgentSpec.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            path = _data_path(tuple(err["loc"]), data)
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden" and "replies" in path[:-1]:
                msg = (f"unknown key {path[-1]!r}; a scripted reply is {{content: ..., "
                       "tool_calls: [{name, arguments}], usage: {prompt_tokens, "
                       "completion_tokens}}} (a bare string is its content)")
            elif err["type"] == "extra_forbidden":
                msg = unknown_key(str(path[-1]), valid_keys(path[:-1], AgentSpec))
            elif err["type"] == "missing":
                msg = f"missing required key {path[-1]!r}"
            key = ".".join(map(str, ("agent", *path)))
            checker.add("error", f"node {name!r}: {key}: {msg}", (*where, *path), "agent")
        return None


def _check_templates(spec: AgentSpec, ns: NodeSpec, error: Callable[..., None]) -> None:
    from jinja2 import TemplateSyntaxError

    from ._prompt import variables

    for key in ("system", "prompt"):
        source = getattr(spec, key)
        if source is None:
            continue
        try:
            names = variables(source)
        except TemplateSyntaxError as exc:
            error(f"{key} is not a valid Jinja2 template: {exc.message} (line {exc.lineno} of "
                  "the template)", key)
            continue
        if ns.reads is not None:
            unread = sorted(names - set(ns.reads) - {"config"})
            if unread:
                error(f"{key} uses {', '.join(unread)}, which the node's reads: "
                      f"[{', '.join(ns.reads)}] does not list (a node sees only its reads)",
                      key)
    for key in ("model", "provider"):  # fixed in the file: what a run calls is reviewed there
        value = getattr(spec, key, None)
        if isinstance(value, str) and ("{{" in value or "{%" in value):
            error(f"{key} is a template ({value!r}), but it is not rendered: the {key} is "
                  "fixed in the workflow file, so that a run's definition says what it "
                  "called (only base_url may read config)", key)
    if spec.base_url is not None and "{{" in spec.base_url:
        try:
            names = variables(spec.base_url)
        except TemplateSyntaxError as exc:
            error(f"base_url is not a valid Jinja2 template: {exc.message}", "base_url")
        else:
            if names - {"config"}:
                error("base_url may read only config (e.g. {{ config.llm_base_url }}), not "
                      f"{', '.join(sorted(names - {'config'}))}", "base_url")


def _check_output(checker: Checker, name: str, spec: AgentSpec, where: tuple[Any, ...],
                  error: Callable[..., None]) -> dict[str, Any] | None:
    from jsonschema import Draft202012Validator, SchemaError

    schema = spec.output
    if schema is not None:
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            at = "".join(f"[{p!r}]" for p in exc.path)
            error(f"output is not a valid JSON Schema (2020-12): {exc.message}"
                  + (f" at {at}" if at else ""), "output")
            schema = None
    if spec.output_model is not None:
        checker.resolve(spec.output_model, (*where, "output_model"), f"node {name!r}")
        cls = checker.result.callables.get(spec.output_model)
        if cls is not None:
            if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
                error(f"output_model {spec.output_model} is not a pydantic model class",
                      "output_model")
            elif schema is None and spec.output is None:
                schema = cls.model_json_schema()
    return schema


def _check_tools(checker: Checker, name: str, spec: AgentSpec, where: tuple[Any, ...],
                 error: Callable[..., None]) -> None:
    seen: dict[str, int] = {}
    if spec.recall:
        seen["recall"] = -1
    for i, tool in enumerate(spec.tools):
        loc = (*where, "tools", i)
        if tool.mcp is not None:  # an MCP server's: its names are known when the node runs
            check_headers(checker, name.partition("/")[0], tool.mcp, (*loc, "mcp"))
            continue
        if tool.call is None:
            assert tool.name is not None
            if tool.agent is not None:
                sub = _parse(checker, f"{name}/{tool.name}", tool.agent, (*loc, "agent"))
                if sub is not None:
                    if sub.prompt is not None:
                        error(f"tool {tool.name!r}: a specialist agent gets the caller's "
                              "request as its message; remove its prompt", "tools", i)
                    check_key(checker, name.partition("/")[0], sub, (*loc, "agent"),
                              f"its tool {tool.name!r} (an agent) has ")
                    _check_tools(checker, f"{name}/{tool.name}", sub, (*loc, "agent"),
                                 error)
            elif not isinstance(tool.workflow, dict):
                error(f"tool {tool.name!r}: workflow {tool.workflow!r} was not read (load "
                      "the workflow from its file, or give the child's definition)",
                      "tools", i)
            made_name = tool.name
            if made_name in seen:
                error(f"two tools are named {made_name!r}; a model calls tools by name",
                      "tools", i)
            seen[made_name] = i
            continue
        checker.resolve(tool.call, loc, f"node {name!r}: tool")
        fn = checker.result.callables.get(tool.call)
        if fn is None:
            continue
        try:
            made = make_tool(fn, tool.confirm is True)
        except ToolDefinitionError as exc:
            error(str(exc), "tools", i)
            continue
        if made.name in seen:
            error(f"two tools are named {made.name!r} (entries {seen[made.name]} and {i}); "
                  "a model calls tools by name", "tools", i)
        seen[made.name] = i


def _check_paths(checker: Checker, name: str, key: str, schema: dict[str, Any]) -> None:
    """A condition reading ``KEY.a.b`` of the agent's output: each step must be a property
    its ``output:`` schema declares (``has(plan.respnse)`` is a typo the run would never
    report: the field is just absent), unless that level allows other properties."""
    from .._definition._checking import _did_you_mean
    from .._definition._expr import ExpressionSyntaxError, compile_expression

    for i, e in enumerate(checker.spec.edges):
        for attr in ("when", "switch", "map"):
            src = getattr(e, attr)
            if src is None:
                continue
            try:
                expr = compile_expression(src)
            except ExpressionSyntaxError:
                continue  # reported with the edge's other checks
            for path in expr.paths:
                head, *steps = path.split(".")
                if head != key:
                    continue
                level: Any = schema
                for depth, step in enumerate(steps):
                    props = level.get("properties") if isinstance(level, dict) else None
                    if not isinstance(props, dict) or level.get("additionalProperties") \
                            not in (None, False):
                        break
                    if step not in props:
                        at = ".".join([key, *steps[:depth]])
                        checker.add("error", f"edge {e.describe()}: {attr} reads {path}, but "
                                    f"the output schema of agent {name!r} has no property "
                                    f"{step!r} at {at}" + _did_you_mean(step, props)
                                    + f" (its properties: {', '.join(props)}); fix the "
                                    "name, or declare the property in agent.output",
                                    ("edges", i, attr), "agent-output")
                        break
                    level = props[step]


def _check_choose(wf: WorkflowSpec, name: str, spec: AgentSpec, schema: dict[str, Any] | None,
                  error: Callable[..., None]) -> None:
    edges = [e for e in wf.edges if e.kind == "choose" and e.source == [name]]
    if spec.choose is None:
        if edges and not spec.tools:
            error(f"the edge {{from: {name}, choose: [...]}} needs something to choose: a "
                  "tool that returns interlock.goto(target) (tools: [...]) or an output "
                  "field naming the successor (choose: FIELD)")
        return
    if not edges:
        error(f"choose: {spec.choose} routes on the output, but no edge "
              f"{{from: {name}, choose: [...]}} declares where it may go", "choose")
        return
    if schema is None:
        return
    props = schema.get("properties")
    field = props.get(spec.choose) if isinstance(props, dict) else None
    if not isinstance(field, dict):
        error(f"choose: {spec.choose}: the output schema has no property {spec.choose!r} to "
              "route on", "choose")
        return
    targets = list(dict.fromkeys(t for e in edges for t in e.targets))
    values = field.get("enum") or ([field["const"]] if "const" in field else [])
    for value in values:
        if value not in targets:
            error(f"choose: {spec.choose}: the output may say {value!r}, which the choose edge "
                  f"does not list (its targets: {', '.join(targets)})", "choose")
