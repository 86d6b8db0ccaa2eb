"""The house's measures (docs/design.md, "Sizes"): rooms small enough to read whole.

A module over 600 lines, a class over 300 or a function over 60 holds more than one concept;
``Any`` stands for "unchecked" and is kept rare; the engine's hardest code carries its
invariants in comments. There are no exceptions.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import interlock

ROOT = Path(interlock.__file__).resolve().parent
MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 600, 300, 60
ANY_PER_KLOC, ENGINE_COMMENT_SHARE = 30, 0.08


def _sources() -> dict[str, str]:
    return {p.relative_to(ROOT.parent).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(ROOT.rglob("*.py"))}


def test_no_room_holds_more_than_one_concept() -> None:
    found = []
    for rel, src in _sources().items():
        lines = src.count("\n")
        if lines > MODULE_LINES:
            found.append(f"module {rel}: {lines} lines (at most {MODULE_LINES})")
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            kind, bound = (("class", CLASS_LINES) if isinstance(node, ast.ClassDef)
                           else ("function", FUNCTION_LINES))
            if size > bound:
                found.append(f"{kind} {rel}:{node.lineno} {node.name}: {size} lines "
                             f"(at most {bound})")
    assert not found, ("one concept per module, class and function -- split these:\n"
                       + "\n".join(found))


def test_any_is_rare() -> None:
    sources = _sources()
    lines = sum(s.count("\n") for s in sources.values())
    anys = sum(len(re.findall(r"\bAny\b", s)) for s in sources.values())
    assert 1000 * anys / lines < ANY_PER_KLOC, (
        f"{anys} `Any` in {lines} lines ({1000 * anys / lines:.1f} per 1,000; the bound is "
        f"{ANY_PER_KLOC}): use interlock._json.JSON / JSONObject for JSON, `object` for an "
        "opaque value, a precise type elsewhere")


def test_the_engine_explains_itself() -> None:
    engine = {r: s for r, s in _sources().items() if r.startswith("interlock/_engine/")}
    lines = sum(s.count("\n") for s in engine.values())
    comments = sum(1 for s in engine.values()
                   for t in tokenize.generate_tokens(io.StringIO(s).readline)
                   if t.type == tokenize.COMMENT)
    assert comments / lines >= ENGINE_COMMENT_SHARE, (
        f"interlock/_engine/ has {comments} comment lines in {lines} ({comments / lines:.1%}; "
        f"at least {ENGINE_COMMENT_SHARE:.0%}): say why, and what must hold, where the code "
        "is hard")
