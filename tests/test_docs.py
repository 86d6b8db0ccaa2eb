"""The examples in the docs run, and print what the docs say they print."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).parent.parent / "docs"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def blocks() -> list[tuple[str, str]]:
    out = []
    for path in sorted(DOCS.glob("*.md")):
        for i, code in enumerate(BLOCK.findall(path.read_text())):
            out.append((f"{path.name}#{i + 1}", code))
    return out


@pytest.mark.parametrize("name, code", blocks(), ids=[n for n, _ in blocks()])
def test_doc_example_runs(name: str, code: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for expected in re.findall(r"# (\{.*\}|\[.*\]|fixed=.*)$", code, re.M):
        assert expected in proc.stdout, f"{name}: expected {expected!r} in {proc.stdout!r}"


def test_every_limit_is_documented_with_its_variable_and_default() -> None:
    from interlock._definition import _limits

    text = (DOCS / "security.md").read_text()
    for limit in _limits.ALL:
        rows = [line for line in text.splitlines() if f"`{limit.env}`" in line]
        assert rows, f"{limit.env} is not in docs/security.md"
        default = limit.default
        shown = {f"{default:,}", f"{default // _limits.MiB} MiB"} if default % _limits.MiB == 0 \
            else {f"{default:,}"}
        assert any(s in rows[0] for s in shown), (limit.env, shown, rows[0])


def test_nothing_a_user_reads_cites_a_document_users_do_not_have() -> None:
    """The docs, the README, docstrings, error messages, the examples, the benchmarks
    and pyproject.toml say what they mean in place: users have no 'SPEC §N' (the project's internal
    contract) to look it up in."""
    root = DOCS.parent
    files = [*DOCS.glob("*.md"), root / "README.md", root / "pyproject.toml",
             *(p for folder in ("interlock", "examples", "bench") for p in
               (root / folder).rglob("*")
               if not any(part.startswith(".venv") for part in p.parts)
               if p.suffix in {".py", ".js", ".css", ".html", ".yaml", ".yml", ".md", ".sh"})]
    cited = [f"{p.relative_to(root)}:{i}" for p in files
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if "SPEC §" in line or "../shared" in line]
    assert not cited, f"say it in place instead: {cited}"
