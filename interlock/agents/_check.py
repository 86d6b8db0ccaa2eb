"""Static checks of an ``agent:`` block, reported like every other diagnostic
(``file:line:col``, located at ``nodes.<name>.agent.<key>``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from .._definition._kinds import Checker
from .._definition._model import NodeSpec, WorkflowSpec
from ._errors import ToolDefinitionError
from ._spec import AgentSpec
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
    _check_templates(spec, ns, error)
    schema = _check_output(checker, name, spec, where, error)
    _check_tools(checker, name, spec, where, error)
    _check_choose(checker.spec, name, spec, schema, error)


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
    for i, tool in enumerate(spec.tools):
        loc = (*where, "tools", i)
        if tool.call is None:  # an MCP server's: its names are known when the node runs
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
