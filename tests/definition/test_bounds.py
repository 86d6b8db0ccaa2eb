"""The bounds on what interlock reads (interlock/_definition/_limits.py): a file, an input, a patch
or
a YAML document too large, too deep or expanding too far is refused quickly, with a
message that names it, the limit and the environment variable that raises it."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import record_row

import interlock
from interlock import UsageError, WorkflowError
from interlock.cli import cli

NODES = """
def noop(state):
    return {}
"""


@pytest.fixture
def wdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    mod = f"bnodes_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{mod}.py").write_text(NODES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    yield tmp_path, mod
    sys.modules.pop(mod, None)


def small(wdir: tuple[Path, str], extra: str = "") -> str:
    root, mod = wdir
    (root / "wf.yaml").write_text(textwrap.dedent(f"""\
        workflow: small
        {extra}
        nodes:
          x: {mod}:noop
        edges:
          - {{from: START, to: x}}
        """))
    return "wf.yaml"


def invoke(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=stdin, catch_exceptions=False)


def cli_bounded(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess with 1 GiB of address space and 60 s: what used to read
    /dev/zero to the end or expand an alias bomb fails the test instead of the machine."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    return subprocess.run([sys.executable, "-m", "interlock", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=False,
                          preexec_fn=limit)


# -- finding 1: no size limit on what is read ------------------------------------------


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_validate_of_dev_zero_is_refused_with_the_limit(wdir: tuple[Path, str]) -> None:
    done = cli_bounded("validate", "/dev/zero", cwd=wdir[0])
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "/dev/zero: error: the workflow file is larger than the 4_194_304 bytes" in done.stdout
    assert "INTERLOCK_MAX_WORKFLOW_BYTES" in done.stdout


def test_a_workflow_file_over_the_limit_is_refused(wdir: tuple[Path, str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = small(wdir, "description: " + "x" * 2000)
    monkeypatch.setenv("INTERLOCK_MAX_WORKFLOW_BYTES", "1000")
    result = invoke("validate", path)
    assert result.exit_code == 2
    assert "wf.yaml: error: the workflow file is larger than the 1_000 bytes" in result.output
    assert "INTERLOCK_MAX_WORKFLOW_BYTES=BYTES" in result.output
    with pytest.raises(WorkflowError, match="larger than the 1_000 bytes"):
        interlock.load(path)
    monkeypatch.setenv("INTERLOCK_MAX_WORKFLOW_BYTES", "100000")
    assert invoke("validate", path).exit_code == 0


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_run_input_file_of_dev_zero_is_refused(wdir: tuple[Path, str]) -> None:
    path = small(wdir)
    done = cli_bounded("run", path, "--input-file", "/dev/zero", "--store", "memory://",
                       cwd=wdir[0])
    assert done.returncode == 2, done.stderr
    assert "error: --input-file /dev/zero is larger than the 4_194_304 bytes" in done.stderr
    assert "INTERLOCK_MAX_INPUT_BYTES" in done.stderr and "Traceback" not in done.stderr


def test_input_set_and_stdin_over_the_limit_are_refused(wdir: tuple[Path, str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = small(wdir)
    monkeypatch.setenv("INTERLOCK_MAX_INPUT_BYTES", "100")
    big = json.dumps({"a": "x" * 200})
    for args, stdin, where in ((["--input", big], None, "--input"),
                               (["--input-file", "-"], big, "--input-file -"),
                               (["--set", f"a={big}"], None, "--set a")):
        result = invoke("run", path, "--store", "memory://", *args, stdin=stdin)
        assert result.exit_code == 2, args
        assert f"error: {where} is " in result.output
        assert "the 100 bytes interlock accepts" in result.output
        assert "INTERLOCK_MAX_INPUT_BYTES=BYTES" in result.output
    assert invoke("run", path, "--store", "memory://", "--input", '{"a": 1}').exit_code == 0


def test_resume_modify_over_the_limit_is_refused(wdir: tuple[Path, str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTERLOCK_MAX_INPUT_BYTES", "100")
    result = invoke("resume", "r-none", "--modify", json.dumps({"a": "x" * 200}),
                    "--store", "memory://")
    assert result.exit_code == 2
    assert "error: --modify is 209 bytes, more than the 100 bytes" in result.output


def test_the_api_refuses_a_large_input_before_storing_anything(
        wdir: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from interlock._store import MemoryStore

    wf = interlock.load(small(wdir))
    store = MemoryStore()
    monkeypatch.setenv("INTERLOCK_MAX_INPUT_BYTES", "1000")
    with pytest.raises(UsageError, match=r"the run's input is \d+_\d+ bytes, more than the "
                                         r"1_000 bytes .*INTERLOCK_MAX_INPUT_BYTES"):
        wf.run_sync({"a": "x" * 5000}, store=store)
    assert store._runs == {}
    assert wf.run_sync({"a": "x" * 500}, store=store).status == "COMPLETED"


# -- finding 2: YAML alias bombs -------------------------------------------------------


def bomb(mod: str, levels: int) -> str:
    lines = ["workflow: bomb", "config:",
             '  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"  a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]"
              for i in range(1, levels + 1)]
    lines += [f"nodes: {{x: {mod}:noop}}", "edges: [{from: START, to: x}]"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [6, 9])
def test_a_billion_laughs_is_refused_at_the_line_where_it_grows(wdir: tuple[Path, str],
                                                                 levels: int) -> None:
    root, mod = wdir
    (root / "bomb.yaml").write_text(bomb(mod, levels))
    done = cli_bounded("validate", "bomb.yaml", cwd=root)
    assert done.returncode == 2, done.stderr
    # a5 (line 8, 597 871 nodes) is the first value over 250 000 once expanded
    assert done.stdout.startswith("bomb.yaml:8:7: error: the document has more than "
                                  "250_000 nodes with its aliases expanded"), done.stdout
    assert "INTERLOCK_MAX_YAML_NODES=NODES" in done.stdout


def test_anchors_and_aliases_still_work(wdir: tuple[Path, str]) -> None:
    root, mod = wdir
    (root / "wf.yaml").write_text(textwrap.dedent(f"""\
        workflow: anchors
        config:
          base: &base {{model: small, retries: [1, 2]}}
          other: *base
        nodes:
          x: &node {{call: "{mod}:noop", timeout: 5s}}
          y: *node
        edges:
          - {{from: START, to: x}}
          - {{from: x, to: y}}
        """))
    wf = interlock.load("wf.yaml")
    assert wf.spec.config["other"] == {"model": "small", "retries": [1, 2]}
    assert wf.spec.nodes["y"].timeout == 5.0


def test_the_node_limit_can_be_lowered_and_names_the_alias(
        wdir: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    root, mod = wdir
    (root / "bomb.yaml").write_text(bomb(mod, 2))  # a2: 1 + 9 * 91 = 820 nodes
    assert interlock.load("bomb.yaml").spec.config["a2"][0][0] == ["lol"] * 9
    monkeypatch.setenv("INTERLOCK_MAX_YAML_NODES", "500")
    with pytest.raises(WorkflowError) as info:
        interlock.load("bomb.yaml")
    assert str(info.value.diagnostics[0]).startswith(
        "bomb.yaml:5:7: error: the document has more than 500 nodes")


# -- finding 3: deep nesting, booleans as counts ---------------------------------------


def nested(depth: int) -> str:
    return '{"a": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize("depth", [150, 1000, 100_000])
def test_deeply_nested_input_exits_2_with_a_message(wdir: tuple[Path, str],
                                                    depth: int) -> None:
    path = small(wdir)
    (wdir[0] / "deep.json").write_text(nested(depth))
    for args in (["--input", nested(depth)], ["--input-file", "deep.json"],
                 ["--set", f"a={nested(depth)}"]):
        result = invoke("run", path, "--store", "memory://", *args)
        assert result.exit_code == 2, (args, result.output)
        assert "is nested more than 100 levels deep" in result.output
        assert "INTERLOCK_MAX_INPUT_DEPTH=LEVELS" in result.output


def test_deeply_nested_api_input_and_patch_are_usage_errors(wdir: tuple[Path, str]) -> None:
    wf = interlock.load(small(wdir))
    value: list[object] = []
    for _ in range(5000):
        value = [value]
    with pytest.raises(UsageError, match=r"the run's input is nested more than 100 levels "
                                         r"deep \(at \$\.a\[0\]"):
        wf.run_sync({"a": value}, store="memory://")
    from interlock._definition._bounds import check_data

    with pytest.raises(UsageError, match="the patch is nested more than 100 levels"):
        check_data({"a": value}, "the patch")
    check_data({"a": [[1]]}, "the patch")


@pytest.mark.parametrize("depth,message", [
    (150, "wf.yaml:2:"), (1000, "nested too deeply for the YAML reader")])
def test_a_deeply_nested_workflow_file_exits_2(wdir: tuple[Path, str], depth: int,
                                               message: str) -> None:
    path = small(wdir, "config: {x: " + "[" * depth + "]" * depth + "}")
    result = invoke("validate", path)
    assert result.exit_code == 2
    assert message in result.output
    assert "INTERLOCK_MAX_YAML_DEPTH" in result.output


@pytest.mark.parametrize("setting", ["limits.steps=true", "limits.tokens=false"])
def test_a_boolean_limit_is_refused(wdir: tuple[Path, str], setting: str) -> None:
    result = invoke("run", small(wdir), "--store", "memory://", "--set", setting)
    assert result.exit_code == 2
    assert f"error: invalid {setting.split('=')[0]}: expected a whole number such as 50, " \
           "got a boolean" in result.output


def test_a_boolean_count_is_refused_in_the_api_and_the_file(wdir: tuple[Path, str]) -> None:
    wf = interlock.load(small(wdir))
    with pytest.raises(UsageError, match=r"limits\.steps: expected a whole number"):
        wf.run_sync({}, store="memory://", limits={"steps": True})
    for extra in ("limits: {steps: true}", "limits: {tokens: true}"):
        with pytest.raises(WorkflowError, match="expected a whole number such as 50, got a "
                                                "boolean"):
            interlock.load(small(wdir, extra))
    root, mod = wdir
    (root / "wf.yaml").write_text(textwrap.dedent(f"""\
        workflow: counts
        nodes:
          x: {{call: "{mod}:noop", retry: {{attempts: true}}, tokens: false}}
        edges:
          - {{from: START, to: x}}
          - {{from: x, to: x, when: "false", max: true}}
        """))
    with pytest.raises(WorkflowError) as info:
        interlock.load("wf.yaml")
    problems = [str(d) for d in info.value.diagnostics]
    assert len(problems) == 3 and all("got a boolean" in p for p in problems), problems


# -- finding 5: trace streams the log --------------------------------------------------


LOOP = """\
workflow: loop
nodes:
  step: {{call: "{mod}:inc", writes: [n]}}
edges:
  - {{from: START, to: step}}
  - {{from: step, to: step, when: "n < 40"}}
  - {{from: step, to: END, otherwise: true}}
"""


def test_trace_reads_the_log_in_pages_and_prints_what_it_printed_whole(
        wdir: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import sqlite3

    import interlock._ops._runs as runs
    from interlock._store import open_store
    from interlock._store._sqlite import SQLiteStore

    root, mod = wdir
    (root / f"{mod}.py").write_text(NODES + "\ndef inc(state):\n    return {'n': "
                                    "state.get('n', 0) + 1}\n")
    (root / "loop.yaml").write_text(LOOP.format(mod=mod))
    url = f"sqlite:///{root / 'runs.db'}"
    assert invoke("run", "loop.yaml", "--store", url, "--run-id", "r-loop").exit_code == 0

    async def whole() -> list[dict[str, object]]:  # what trace printed before: all at once
        st = open_store(url)
        try:
            out = []
            for entry in await st.entries("r-loop"):
                rec = entry.record()
                for key in runs.TRACE_KEYS:
                    rec.setdefault(key, None)
                rec["hash"] = entry.hash
                out.append(rec)
            return out
        finally:
            await st.close()

    records = asyncio.run(whole())
    assert len(records) > 100
    one_page = invoke("trace", "r-loop", "--store", url)

    def no_whole_log(self: SQLiteStore, run_id: str, after: int = 0) -> None:
        raise AssertionError("trace read the whole log at once")

    monkeypatch.setattr(SQLiteStore, "entries", no_whole_log)
    monkeypatch.setattr(runs, "TRACE_PAGE", 7)
    shown = invoke("trace", "r-loop", "--json", "--store", url)
    assert shown.exit_code == 0 and shown.stderr == ""
    # each stored record, and (log format 2) what it implies: the loop's otherwise edge
    printed = json.loads(shown.stdout)
    implied = sum(len(r.pop("implies", ())) for r in printed)
    assert implied > 0
    assert json.dumps(printed, ensure_ascii=False, default=str) == \
        json.dumps(records, ensure_ascii=False, default=str)
    paged = invoke("trace", "r-loop", "--store", url)
    assert paged.exit_code == 0
    assert paged.stdout == one_page.stdout
    assert len(paged.stdout.splitlines()) == len(records) + implied  # a line each

    with sqlite3.connect(root / "runs.db") as conn:
        conn.execute("UPDATE entries SET data = replace(data, '\"attempt\":1', "
                     f"'\"attempt\":2') WHERE id = {record_row('r-loop', 40)}")
    for args in (["--json"], []):
        broken = invoke("trace", "r-loop", *args, "--store", url)
        assert broken.exit_code == 0
        assert "warning: run r-loop's log does not verify at record 40: hash does not " \
               "match" in broken.stderr
        assert len(broken.stdout.splitlines()) == (1 if args else len(records) + implied)


# -- finding 4: reading a workflow file is linear and fast (libyaml, ruamel's results) ----


TRICKY = [
    "a: 1\nb: -2\nc: +3\nd: 1.5\ne: 1e3\nf: 1.\ng: true\nh: False\ni: null\nj: ~\nk:\n",
    "a: yes\nb: no\nc: on\nd: 0755\ne: 0x1F\nf: 1_000\ng: .inf\nh: .5\ni: 2001-01-01\n",
    "a: 'q'\nb: \"x\\ty\"\nc: |\n  line 1\n  line 2\nd: >-\n  folded\n  text\ne: !!str 5\n",
    "a: &x [1, 'two', {k: v}]\nb: *x\nc:\n  - *x\n  - - nested\n    - seq\n  - k: 1\n    j: 2\n",
    "base: &b {x: 1}\nmerged:\n  <<: *b\n  y: 2\n",
    "? complex\n: key\nplain multi\n  line: v\n'quoted key': 1\n1: int key\n",
    "%YAML 1.2\n---\na: 1\n",
    "a: 1\n---\nb: 2\n",
    "a: 1\na: 2\n",
    "# comment\na: [1, 2,   3]   # trailing\nb: {c: d, e: [f, {g: h}]}\nü: ñ ✓ 🚀\n",
    "just a scalar\n",
    "",
]


def _typed(value: object) -> object:
    """``value`` with the type of every part: 1, 1.0 and True compare unequal."""
    if isinstance(value, dict):
        return [("dict", _typed(k), _typed(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", *(_typed(v) for v in value)]
    return (type(value).__name__, repr(value))


def _both_ways(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    from interlock._definition import _spec, _yaml_fast

    def read() -> object:
        try:
            data, smap = _spec.read_file(path)
            return _typed(data), smap.positions
        except WorkflowError as exc:
            return [str(d) for d in exc.diagnostics]

    fast = read()
    with monkeypatch.context() as m:
        m.setattr(_yaml_fast, "read", lambda text, file: None)
        slow = read()
    return fast, slow


@pytest.mark.parametrize("text", TRICKY)
def test_the_fast_reader_gives_what_ruamel_gives(tmp_path: Path, text: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text(text)
    fast, slow = _both_ways(path, monkeypatch)
    assert fast == slow


def test_the_fast_reader_gives_what_ruamel_gives_for_the_examples(
        monkeypatch: pytest.MonkeyPatch) -> None:
    examples = sorted((Path(interlock.__file__).parent.parent / "examples").rglob("*.yaml"))
    assert examples
    for path in examples:
        fast, slow = _both_ways(path, monkeypatch)
        assert fast == slow, path


def test_the_fast_reader_declines_what_it_does_not_read_as_ruamel_would() -> None:
    from interlock._definition import _yaml_fast

    for text in TRICKY[1:3] + TRICKY[4:9]:
        assert _yaml_fast.read(text, "wf.yaml") is None, text
    data, positions = _yaml_fast.read(TRICKY[3], "wf.yaml") or (None, {})
    assert data == {"a": [1, "two", {"k": "v"}], "b": [1, "two", {"k": "v"}],
                    "c": [[1, "two", {"k": "v"}], ["nested", "seq"], {"k": 1, "j": 2}]}
    assert data["a"] is not data["b"]  # each use of an alias is its own copy
    assert positions[("c", 2, "j")] == (8, 5)
