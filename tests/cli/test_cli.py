"""The command line (SPEC §4): exit codes, --json, --set, --input(-file), validate, graph.

Each test writes a small workflow and a node module into ``tmp_path`` and runs
there, the way a user would (call paths resolve from the working directory).
Node modules get a unique name per test: Python caches imported modules.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from interlock._definition._render import dot_text, mermaid_text, to_dot, to_mermaid
from interlock._definition._spec import parse
from interlock.cli import cli, config_overrides, exit_code_for, parse_sets, parse_value

SPEC_KEYS = {"run_id", "workflow", "status", "state", "steps", "tokens", "error", "waiting"}
DIAGNOSTIC = re.compile(r"^\S+\.yaml:\d+:\d+: (error|warning): .+", re.MULTILINE)

NODES = """
def first(state):
    return {"x": 1}

def second(state):
    return {"y": state["x"] + 1}

def boom(state):
    raise ValueError("nope")

def inc(state):
    return {"n": state.get("n", 0) + 1}

def echo(state):
    return {"seen": state.get("event")}

def show_config(state, ctx):
    return {"cfg": dict(ctx.config)}
"""

WORKFLOW = """
workflow: demo
config: {go: true}
nodes:
  a: {mod}:first
  b: {mod}:second
edges:
  - {{from: START, to: a}}
  - {{from: a, to: b, when: 'config.go'}}
  - {{from: a, to: END, otherwise: true}}
"""


class Project:
    """A scratch project directory: a node module and workflow files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mod = f"nodes_{uuid.uuid4().hex[:10]}"
        (root / f"{self.mod}.py").write_text(NODES)
        importlib.invalidate_caches()

    def workflow(self, text: str, name: str = "wf.yaml") -> str:
        body = textwrap.dedent(text).replace("{mod}", self.mod)
        (self.root / name).write_text(body.replace("{{", "{").replace("}}", "}"))
        return name


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Project]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    p = Project(tmp_path)
    yield p
    sys.modules.pop(p.mod, None)


def invoke(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=stdin, catch_exceptions=False)


def run(*args: str, stdin: str | None = None) -> Result:
    return invoke("run", *args, "--store", "memory://", stdin=stdin)


def run_json(*args: str, stdin: str | None = None) -> tuple[Result, dict[str, Any]]:
    result = run(*args, "--json", stdin=stdin)
    data = json.loads(result.stdout)  # exactly one JSON document, nothing else
    assert isinstance(data, dict)
    return result, data


def subprocess_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "interlock", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=False)


# -- run: exit codes and output ------------------------------------------------------------


def test_run_completed_prints_progress_and_summary(project: Project) -> None:
    wf = project.workflow(WORKFLOW)
    result = run(wf)
    assert result.exit_code == 0, result.output
    assert re.search(r"^run \w+ started: workflow demo$", result.stderr, re.MULTILINE)
    assert re.search(r"^\s+a\s+completed\s+[\d.]+ ms", result.stderr, re.MULTILINE)
    assert "a -> b  [config.go = true]  taken" in result.stderr
    assert "\x1b[" not in result.output  # no colour codes when not a terminal
    assert re.search(r"^\s*b\s+1\s+[\d.]+ ms\s+0\s+completed", result.stdout, re.MULTILINE)
    assert "COMPLETED" in result.stdout


def test_run_json_prints_exactly_one_object_with_the_spec_keys(project: Project) -> None:
    result, data = run_json(project.workflow(WORKFLOW))
    assert result.exit_code == 0
    assert set(data) == SPEC_KEYS
    assert data["status"] == "COMPLETED"
    assert data["workflow"] == "demo"
    assert data["state"] == {"x": 1, "y": 2}
    assert data["steps"] == 2
    assert data["error"] is None and data["waiting"] is None
    assert data["run_id"] in result.stderr


def test_run_id_is_printed_on_stderr(project: Project) -> None:
    result, data = run_json(project.workflow(WORKFLOW), "--run-id", "my-run-1")
    assert data["run_id"] == "my-run-1"
    assert "my-run-1" in result.stderr
    assert "my-run-1" not in result.stdout.replace(json.dumps(data), "")


def test_failed_node_exits_1_with_the_error(project: Project) -> None:
    wf = project.workflow("""
        workflow: failing
        nodes:
          a: {mod}:first
          bad: {mod}:boom
        edges:
          - {{from: START, to: a}}
          - {{from: a, to: bad}}
    """)
    result, data = run_json(wf)
    assert result.exit_code == 1
    assert data["status"] == "FAILED"
    assert data["error"]["type"] == "node_error"
    assert data["error"]["node"] == "bad"
    assert "ValueError: nope" in data["error"]["message"]
    human = run(wf)
    assert human.exit_code == 1
    assert "FAILED" in human.stdout and "ValueError: nope" in human.stdout
    assert re.search(r"^\s+bad\s+failed", human.stderr, re.MULTILINE)


def test_waiting_for_approval_exits_3(project: Project) -> None:
    wf = project.workflow("""
        workflow: gated
        nodes:
          a: {mod}:first
          gate: {{approval: {{show: [x]}}}}
        edges:
          - {{from: START, to: a}}
          - {{from: a, to: gate}}
    """)
    result, data = run_json(wf)
    assert result.exit_code == 3
    assert data["status"] == "WAITING_APPROVAL"
    assert data["waiting"]["node"] == "gate"
    assert data["waiting"]["show"] == {"x": 1}


@pytest.mark.parametrize(("status", "code"), [
    ("COMPLETED", 0), ("FAILED", 1), ("WAITING_APPROVAL", 3), ("REJECTED", 4),
    ("CANCELLED", 1),
])
def test_exit_code_for_each_status(status: str, code: int) -> None:
    assert exit_code_for(status) == code


# -- run: --set, --input, --input-file -------------------------------------------------------


def test_set_overrides_config(project: Project) -> None:
    result, data = run_json(project.workflow(WORKFLOW), "--set", "go=false")
    assert result.exit_code == 0
    assert data["state"] == {"x": 1}  # a -> b was not taken
    human = run(project.workflow(WORKFLOW), "--set", "go=false")
    assert "a -> b  [config.go = false]  skipped" in human.stderr


def test_set_of_an_undeclared_config_key_warns(project: Project) -> None:
    result, _ = run_json(project.workflow(WORKFLOW), "--set", "goo=false")
    assert result.exit_code == 0
    assert "warning: --set goo:" in result.stderr and "declares no config key 'goo'" in \
        result.stderr and "declared: go" in result.stderr
    quiet, _ = run_json(project.workflow(WORKFLOW), "--set", "go=false")
    assert "warning" not in quiet.stderr


def test_set_nested_config_keeps_sibling_keys(project: Project) -> None:
    wf = project.workflow("""
        workflow: cfg
        config: {model: {name: small, temperature: 0.5}, mode: a}
        nodes:
          c: {mod}:show_config
        edges:
          - {{from: START, to: c}}
    """)
    _, data = run_json(wf, "--set", "model.name=large", "--set", "mode=fast",
                       "--set", "extra.deep.flag=true")
    assert data["state"]["cfg"] == {"model": {"name": "large", "temperature": 0.5},
                                    "mode": "fast", "extra": {"deep": {"flag": True}}}


def test_set_limits_steps_stops_a_loop_with_exit_1(project: Project) -> None:
    wf = project.workflow("""
        workflow: loop
        nodes:
          step: {{call: {mod}:inc, writes: [n]}}
        edges:
          - {{from: START, to: step}}
          - {{from: step, to: step, when: 'n < 100'}}
          - {{from: step, to: END, otherwise: true}}
    """)
    result, data = run_json(wf, "--set", "limits.steps=3")
    assert result.exit_code == 1
    assert data["status"] == "FAILED"
    assert data["error"]["type"] == "step_limit"
    assert data["steps"] == 3
    assert data["state"] == {"n": 3}


def test_input_file_provides_the_input(project: Project) -> None:
    wf = project.workflow("""
        workflow: with-input
        input: [event]
        nodes:
          e: {mod}:echo
        edges:
          - {{from: START, to: e}}
    """)
    (project.root / "in.json").write_text(json.dumps({"event": {"id": 7}}))
    result, data = run_json(wf, "--input-file", "in.json")
    assert result.exit_code == 0
    assert data["state"] == {"event": {"id": 7}, "seen": {"id": 7}}
    _, from_stdin = run_json(wf, "--input-file", "-", stdin='{"event": "s"}')
    assert from_stdin["state"]["seen"] == "s"
    _, inline = run_json(wf, "--input", '{"event": 1}')
    assert inline["state"]["seen"] == 1


def test_missing_declared_input_is_a_usage_error(project: Project) -> None:
    wf = project.workflow("""
        workflow: with-input
        input: [event]
        nodes:
          e: {mod}:echo
        edges:
          - {{from: START, to: e}}
    """)
    result = run(wf, "--json")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "event" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--input", "{bad"], "--input is not valid JSON"),
    (["--input", "[1, 2]"], "must be a JSON object"),
    (["--input", "{}", "--input-file", "in.json"], "either --input or --input-file"),
    (["--input-file", "missing.json"], "cannot read --input-file missing.json"),
    (["--set", "novalue"], "expected KEY=VALUE"),
    (["--set", "=1"], "expected KEY=VALUE"),
    (["--set", "limits.steps=0"], "limits.steps"),
    (["--set", "limits.bogus=1"], "bogus"),
    (["--set", "limits.a.b=1"], "limits.NAME=VALUE"),
    (["--set", "go=1", "--set", "go.deeper=2"], "not a mapping"),
])
def test_bad_usage_exits_2_with_a_message(project: Project, args: list[str],
                                          message: str) -> None:
    result = run(project.workflow(WORKFLOW), "--json", *args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert message in result.stderr
    assert result.stderr.startswith("error: ")


def test_unknown_store_exits_2(project: Project) -> None:
    result = invoke("run", project.workflow(WORKFLOW), "--store", "nosuch://x")
    assert result.exit_code == 2
    assert "unknown store URL" in result.stderr


def test_invalid_workflow_exits_2_with_file_line_col(project: Project) -> None:
    wf = project.workflow("""
        workflow: broken
        nodes:
          a: {mod}:first
        edges:
          - {{from: START, to: a}}
          - {{from: a, to: ghost}}
    """)
    result = run(wf, "--json")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert re.search(r"^wf\.yaml:7:\d+: error: .*ghost", result.stderr, re.MULTILINE)


def test_schema_error_exits_2_with_file_line_col(project: Project) -> None:
    wf = project.workflow("""
        workflow: typo
        nodes:
          a: {{call: {mod}:first, retires: 3}}
        edges:
          - {{from: START, to: a}}
    """)
    result = run(wf)
    assert result.exit_code == 2
    assert re.search(r"^wf\.yaml:4:\d+: error: .*retires", result.stderr, re.MULTILINE)


# -- --set parsing -------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "value"), [
    ("0.9", 0.9), ("3", 3), ("true", True), ("false", False), ("null", None),
    ('"quoted"', "quoted"), ("plain text", "plain text"), ("NaN", "NaN"), ("", ""),
    ("[1, 2]", [1, 2]),
])
def test_set_values_are_json_or_text(raw: str, value: Any) -> None:
    assert parse_value(raw) == value


def test_parse_sets_splits_config_and_limits() -> None:
    config, limits = parse_sets(("a=1", "b.c=x", "limits.steps=5", "limits.timeout=30s",
                                 "url=http://h/?q=1"))
    assert config == [(("a",), 1), (("b", "c"), "x"), (("url",), "http://h/?q=1")]
    assert limits == {"steps": 5, "timeout": "30s"}
    base = {"b": {"c": "old", "d": 2}, "e": 3}
    assert config_overrides(base, config) == {"a": 1, "b": {"c": "x", "d": 2},
                                              "url": "http://h/?q=1"}
    assert base == {"b": {"c": "old", "d": 2}, "e": 3}  # not modified


# -- validate --------------------------------------------------------------------------------


def test_validate_ok(project: Project) -> None:
    result = invoke("validate", project.workflow(WORKFLOW))
    assert result.exit_code == 0
    assert result.stdout == "ok: wf.yaml (2 nodes, 3 edges)\n"


def test_validate_warning_still_exits_0(project: Project) -> None:
    wf = project.workflow("""
        workflow: diamond
        nodes:
          top: {mod}:first
          left: {mod}:first
          right: {mod}:second
          bottom: {mod}:echo
        edges:
          - {{from: START, to: top}}
          - {{from: top, to: [left, right]}}
          - {{from: left, to: bottom}}
          - {{from: right, to: bottom}}
    """)
    result = invoke("validate", wf)
    assert result.exit_code == 0, result.output
    # the warnings, then the verdict (as for an invalid file)
    assert result.stdout.endswith("ok: wf.yaml (4 nodes, 4 edges, 1 warning)\n")
    warnings = [m for m in DIAGNOSTIC.finditer(result.stdout) if m.group(1) == "warning"]
    assert warnings and "join" in result.stdout


def test_validate_errors_exit_2_and_list_every_problem(project: Project) -> None:
    wf = project.workflow("""
        workflow: bad
        nodes:
          a: {mod}:first
          b: {mod}:does_not_exist
        edges:
          - {{from: START, to: a}}
          - {{from: a, to: b, when: 'x >'}}
          - {{from: b, to: END}}
    """)
    result = invoke("validate", wf)
    assert result.exit_code == 2
    errors = [m.group(0) for m in DIAGNOSTIC.finditer(result.stdout) if m.group(1) == "error"]
    assert len(errors) >= 2, result.stdout
    assert any("does_not_exist" in e for e in errors)
    assert any("does not compile" in e for e in errors)
    assert result.stdout.rstrip().splitlines()[-1].startswith("invalid: wf.yaml (")


def test_validate_missing_file_exits_2(project: Project) -> None:
    result = invoke("validate", "nope.yaml")
    assert result.exit_code == 2
    assert "nope.yaml" in result.stdout and "cannot read" in result.stdout


# -- graph -----------------------------------------------------------------------------------

GRAPH = """
workflow: incident
nodes:
  intake: {mod}:first
  retrieval: {mod}:first
  rag: {mod}:first
  rca: {mod}:first
  approval: {{approval: {{show: [rca]}}}}
  code_fix: {mod}:first
  risk: {mod}:first
edges:
  - {{from: START, to: intake}}
  - {{from: intake, to: [retrieval, rag]}}
  - {{from: [retrieval, rag], to: rca}}
  - {{from: rca, to: approval}}
  - {{from: approval, to: code_fix, when: 'approval.decision == "approved" && rca.c >= 0.5'}}
  - {{from: approval, to: END, otherwise: true}}
  - {{from: code_fix, to: risk, max: 3}}
  - {{from: risk, switch: 'risk.level', cases: {{HIGH: approval, LOW: END, 2: END}},
      default: rca}}
"""


def test_graph_mermaid_shows_conditions_joins_and_styles(project: Project) -> None:
    result = invoke("graph", project.workflow(GRAPH))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "flowchart TD" in out
    assert 'START(["START"])' in out and 'END(["END"])' in out
    assert 'n_approval{{"approval"}}' in out and "class n_approval approval" in out
    assert 'j2(("join"))' in out
    assert "n_retrieval --> j2" in out and "n_rag --> j2" in out and "j2 --> n_rca" in out
    assert ('n_approval -.->|"approval.decision == #quot;approved#quot; #amp;#amp; '
            'rca.c #gt;= 0.5"| n_code_fix') in out
    assert 'n_approval -.->|"otherwise"| END' in out
    assert 'n_code_fix -.->|"max 3"| n_risk' in out
    assert 'n_risk -.->|"risk.level == #quot;HIGH#quot;"| n_approval' in out
    assert 'n_risk -.->|"risk.level in [#quot;LOW#quot;, 2]"| END' in out
    assert 'n_risk -.->|"default"| n_rca' in out


def test_graph_dot_shows_conditions_joins_and_styles(project: Project) -> None:
    result = invoke("graph", project.workflow(GRAPH), "--format", "dot")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith('digraph "incident" {')
    assert "j2 [label=\"join\", shape=circle" in out
    assert 'n_approval [label="approval", shape=hexagon' in out
    assert ('n_approval -> n_code_fix [label="approval.decision == \\"approved\\" && '
            'rca.c >= 0.5", style=dashed];') in out
    assert 'n_approval -> END [label="otherwise", style=dashed];' in out
    assert 'n_risk -> END [label="risk.level in [\\"LOW\\", 2]", style=dashed];' in out
    assert "START -> n_intake;" in out


def test_graph_does_not_import_node_modules(project: Project) -> None:
    wf = project.workflow("""
        workflow: draft
        nodes:
          a: not_written_yet:fn
        edges:
          - {{from: START, to: a}}
    """)
    result = invoke("graph", wf)
    assert result.exit_code == 0
    assert "START --> n_a" in result.stdout and "n_a --> END" in result.stdout


def test_graph_schema_error_exits_2(project: Project) -> None:
    wf = project.workflow("workflow: x\nnodes:\n  a:\n    cal: m:f\n")
    result = invoke("graph", wf)
    assert result.exit_code == 2
    assert re.search(r"^wf\.yaml:4:\d+: error: .*'cal'", result.stderr, re.MULTILINE)


def test_render_router_choose_and_unknown_nodes() -> None:
    spec = parse({
        "workflow": "r", "nodes": {"a": "m:f", "b": "m:f", "c": "m:f"},
        "edges": [{"from": "START", "to": "a"},
                  {"from": "a", "router": "m:route", "to": ["b", "END"], "max": 2},
                  {"from": "b", "choose": ["c", "weird name"]}],
    })
    mermaid = to_mermaid(spec)
    assert 'n_a -.->|"router m:route, max 2"| n_b' in mermaid
    assert 'n_b -.->|"choose"| n_c' in mermaid
    assert 'x4["weird name"]' in mermaid and "class x4 unknown" in mermaid
    dot = to_dot(spec)
    assert 'n_a -> END [label="router m:route, max 2", style=dashed];' in dot
    assert "n_c -> END;" in dot


def test_escaping() -> None:
    assert mermaid_text('a "b" #1 <x> && y | `z`\nw') == (
        "a #quot;b#quot; #35;1 #lt;x#gt; #amp;#amp; y #124; #96;z#96; w")
    assert dot_text('say "hi" \\n\nnext') == '"say \\"hi\\" \\\\n\\nnext"'


# -- through a real process ------------------------------------------------------------------


def test_subprocess_run_json_and_exit_codes(project: Project) -> None:
    ok = subprocess_cli("run", project.workflow(WORKFLOW), "--json", "--store", "memory://",
                        cwd=project.root)
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert set(data) == SPEC_KEYS and data["status"] == "COMPLETED"
    assert f"run {data['run_id']} started" in ok.stderr
    failing = project.workflow("""
        workflow: failing
        nodes:
          bad: {mod}:boom
        edges:
          - {{from: START, to: bad}}
    """, name="failing.yaml")
    failed = subprocess_cli("run", failing, "--store", "memory://", cwd=project.root)
    assert failed.returncode == 1
    assert "FAILED" in failed.stdout and "ValueError: nope" in failed.stdout


def test_subprocess_validate_and_help(project: Project) -> None:
    bad = project.workflow("""
        workflow: bad
        nodes:
          a: {mod}:first
        edges:
          - {{from: START, to: missing}}
    """)
    result = subprocess_cli("validate", bad, cwd=project.root)
    assert result.returncode == 2
    assert re.search(r"^wf\.yaml:\d+:\d+: error: .*missing", result.stdout, re.MULTILINE)
    helped = subprocess_cli("--help", cwd=project.root)
    assert helped.returncode == 0
    for command in ("run", "validate", "graph"):
        assert command in helped.stdout


def test_the_engine_can_be_called_from_a_thread_that_cannot_take_signals() -> None:
    """call_engine installs its SIGTERM handler only where the loop can take signals;
    elsewhere (not the main thread) it runs the coroutine as it is."""
    import threading

    from interlock.cli._common import call_engine

    async def answer() -> int:
        return 42

    out: list[int] = []
    worker = threading.Thread(target=lambda: out.append(call_engine(answer())))
    worker.start()
    worker.join(10)
    assert out == [42]


def test_a_large_workflows_summary_counts_its_nodes_and_lists_the_rest(project: Project
                                                                        ) -> None:
    """More than 200 nodes: the summary counts them by status and has a row only for the
    nodes neither completed nor not run (a 10,000-row table summarises nothing)."""
    n = 250
    lines = ["workflow: big", "nodes:"]
    lines += [f"  n{i}: {{mod}}:first" for i in range(n - 1)] + [f"  n{n - 1}: {{mod}}:boom"]
    lines += ["edges:", "  - {{from: START, to: n0}}"]
    lines += [f"  - {{{{from: n{i}, to: n{i + 1}}}}}" for i in range(n - 1)]
    wf = project.workflow("\n".join(lines) + "\n")
    result = run(wf)
    assert result.exit_code == 1, result.output
    assert f"{n} nodes: {n - 1} completed, 1 failed; the table lists 1 of the 1" in result.stdout
    rows = [line for line in result.stdout.splitlines() if re.match(r"^\s*n\d+\s", line)]
    assert len(rows) == 1 and "failed" in rows[0] and rows[0].split()[0] == f"n{n - 1}"
    assert len(re.findall(r"^\s+n\d+\s+completed", result.stderr, re.MULTILINE)) == n - 1


def test_progress_on_a_colour_terminal_has_rich_styles_and_the_same_text(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    wf = project.workflow(WORKFLOW)
    plain = run(wf)
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    coloured = run(wf)
    assert coloured.exit_code == plain.exit_code == 0
    assert "\x1b[1m" in coloured.stderr  # the node names in bold
    assert "\x1b[32mcompleted\x1b[0m" in coloured.stderr  # green, as _STATUS_STYLE says

    def strip(text: str) -> list[str]:  # the text without colours or times
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)
        return [re.sub(r"[\d.]+ ms|\w{20}", "", line) for line in text.splitlines()]

    assert strip(coloured.stderr) == strip(plain.stderr)
