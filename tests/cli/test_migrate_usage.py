"""``interlock migrate --help`` names the file where it is given: ``--to FILE``."""

from __future__ import annotations

from click.testing import CliRunner

from interlock.cli import cli


def test_migrate_help_shows_the_file_with_its_option() -> None:
    shown = CliRunner().invoke(cli, ["migrate", "--help"], prog_name="interlock")
    assert shown.exit_code == 0, shown.output
    usage, _, rest = shown.output.partition("\n")
    assert usage == "Usage: interlock migrate --to FILE [OPTIONS] RUN_ID"
    assert "the workflow file --to FILE names" in " ".join(rest.split())
    assert "definition in FILE" not in " ".join(rest.split())
    missing = CliRunner().invoke(cli, ["migrate", "r-1"])
    assert missing.exit_code == 2 and "--to FILE" in missing.output
