"""A migration onto a changed definition, after the code of a module the run runs changed
too: the changed module is listed with the differences (``--dry-run``, ``--json``: the
API's ``differences``), and the migration does not move the run onto that code in
silence -- it keeps the digest the run recorded, so a continuation treats the change as
any code drift (said and recorded as ``run.code_changed``; refused under
``--strict-code``) until a migration onto the run's own file accepts it, on the record."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_versions import GATED, NODES, Project, with_v2

from interlock.support import set_strict_code


@pytest.fixture(autouse=True)
def _lenient() -> Any:
    yield
    set_strict_code(None)  # (--strict-code is a process-wide setting of the CLI's)


@pytest.fixture
def project(make_project: Any) -> Project:
    return Project(make_project(NODES, "migdrift_nodes"))


def test_a_migration_onto_a_new_definition_says_the_code_changed_and_keeps_it_drifted(
        project: Project) -> None:
    assert project.start(GATED, "d1").exit_code == 3
    v2 = with_v2(project)
    project.edit_after()  # node b's module changes on disk
    line = f"the code of module {project.after!r} changed since the run started"
    dry = project.cli("migrate", "d1", "--to", v2, "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    [said] = [d for d in json.loads(dry.stdout)["differences"] if "code" in d]
    assert said.startswith(line) and "--strict-code refuses it" in said, said
    moved = project.cli("migrate", "d1", "--to", v2, "--by", "ops")
    assert moved.exit_code == 0, moved.output
    assert line in moved.stdout and "node 'c' added" in moved.stdout
    # still said before anyone decides, and refused under --strict-code
    _, status = project.base.cli_json("status", "d1")
    assert status["code_changed"] == ["b"]
    refused = project.cli("resume", "d1", "--approve", "--by", "al", "--strict-code")
    assert refused.exit_code == 2, refused.output
    assert f"node 'b' (module {project.after})" in refused.stderr
    assert "interlock migrate d1 --to FILE" in refused.stderr
    # accepted on the record: the run's own file (now v2) again, with the code as it is
    accepted = project.cli("migrate", "d1", "--to", v2, "--by", "ops")
    assert accepted.exit_code == 0, accepted.output
    assert f"the code of module {project.after!r} changed" in accepted.stdout
    done = project.cli("resume", "d1", "--approve", "--by", "al", "--strict-code")
    assert done.exit_code == 0, done.output
    recs = project.records("d1")
    assert [r["type"] for r in recs].count("run.migrated") == 2
    assert "run.code_changed" not in [r["type"] for r in recs]
    [first, second] = [r["seq"] for r in recs if r["type"] == "run.migrated"]
    verified = project.cli("verify", "d1")  # the migrations it checked are said
    assert verified.exit_code == 0, verified.output
    assert (f"chain and fold verified; 2 definitions, each segment under its own: migrated "
            f"at record {first} by ops, moved onto new code at record {second} by ops)"
            ) in verified.output
    exported = project.cli("export", "d1")
    (project.base.root / "d1.jsonl").write_text(exported.stdout)
    from_file = project.base.cli("verify", "--file", "d1.jsonl")
    assert f"migrated at record {first} by ops" in from_file.output, from_file.output


def test_without_strict_code_the_continuation_says_so_and_records_it(
        project: Project) -> None:
    assert project.start(GATED, "d2").exit_code == 3
    v2 = with_v2(project)
    project.edit_after()
    assert project.cli("migrate", "d2", "--to", v2, "--by", "ops").exit_code == 0
    went = project.cli("resume", "d2", "--approve", "--by", "al")
    assert went.exit_code == 0, went.output
    assert f"node 'b' (module {project.after})" in went.stderr  # the warning
    [changed] = [r for r in project.records("d2") if r["type"] == "run.code_changed"]
    assert changed["nodes"] == ["b"]
    assert project.cli("verify", "d2").exit_code == 0
