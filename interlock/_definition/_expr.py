"""Conditions in CEL: compile once, bound, list what they read, evaluate.

CEL comes from ``common-expression-language`` (a Rust implementation). An
expression sees the state's fields as top-level names, plus ``config`` and
``run``. We keep three facts per expression, found at load:

- the top-level names it reads (the ``program.references()`` variables, less
  the iteration variables of macros) -- the evaluation context is built from
  just those, and validation checks each is fed by someone;
- the dotted paths it reads (``rca.confidence``) -- recorded with every edge
  decision so a reader of the log can see *why*;
- that it is bounded: CEL macros have no cost limit (a nested ``map`` over a
  large list can run for seconds), so length and macro nesting are capped.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from ._cost import CostModel, Size
from ._limits import EXPRESSION_COST

MAX_LENGTH = 1000
MAX_MACROS = 4

_MACROS = ("all", "exists", "exists_one", "map", "filter")
_STRING_RE = re.compile(
    r"""(?:[rR]?(?:'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*"))""", re.S)
_PATH_RE = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?!\w)(\s*\()?")
_ITER_VAR_RE = re.compile(r"\.(?:all|exists|exists_one|map|filter)\(\s*([A-Za-z_]\w*)\s*,")
_MACRO_RE = re.compile(r"\.(?:" + "|".join(_MACROS) + r")\s*\(")
_KEYWORDS = frozenset({"true", "false", "null", "in", "has"})

_cel: ModuleType | None = None


def _cel_module() -> ModuleType:
    """The CEL extension module.

    ``import cel`` also imports the package's interactive CLI (prompt_toolkit, about
    300 ms); the engine needs only the compiled extension, so load it directly -- under
    its own name, ``cel.cel``, and registered as such: the extension may be initialised
    only once per process (a second load panics), so a later ``import cel`` by the
    user's code must find this one, and one the user's code already loaded is reused.
    Falls back to the package import if the wheel's layout ever changes.
    """
    global _cel
    if _cel is not None:
        return _cel
    mod: ModuleType | None = sys.modules.get(_EXTENSION)
    try:
        spec = importlib.util.find_spec("cel") if mod is None else None
        locations = spec.submodule_search_locations if spec else None
        if locations:
            folder = next(iter(locations))
            for fname in os.listdir(folder):
                if fname.startswith("cel.") and fname.endswith(
                    tuple(importlib.machinery.EXTENSION_SUFFIXES)
                ):
                    path = os.path.join(folder, fname)
                    loader = importlib.machinery.ExtensionFileLoader(_EXTENSION, path)
                    ext_spec = importlib.util.spec_from_file_location(_EXTENSION, path,
                                                                      loader=loader)
                    if ext_spec is not None:
                        mod = importlib.util.module_from_spec(ext_spec)
                        sys.modules[_EXTENSION] = mod
                        try:
                            loader.exec_module(mod)
                        except BaseException:
                            del sys.modules[_EXTENSION]
                            raise
                    break
    except (ImportError, OSError):  # pragma: no cover - depends on the wheel's layout
        mod = None
    if mod is None or not hasattr(mod, "compile"):  # pragma: no cover
        import cel

        mod = cel
    _cel = mod
    return mod


_EXTENSION = "cel.cel"  # the compiled module's name inside the ``cel`` package


class Lookup(Protocol):
    """What an expression is evaluated against: name -> value (state, config, run)."""

    def __getitem__(self, name: str, /) -> Any: ...

    def __contains__(self, name: object, /) -> bool: ...


class ExpressionSyntaxError(ValueError):
    """An expression does not compile or exceeds the bounds. ``col`` is 1-based if known."""

    def __init__(self, message: str, col: int | None = None) -> None:
        super().__init__(message)
        self.col = col


class EvaluationError(Exception):
    """Evaluating a compiled expression failed (missing field, wrong type, ...)."""


@dataclass(frozen=True, slots=True)
class Expression:
    source: str
    names: tuple[str, ...]  # top-level names read
    paths: tuple[str, ...]  # dotted paths read, for the log
    program: Any
    # facts for the hot path: it reads only state fields (not ``config`` or ``run``),
    # so a plain dict of the state will do as its scope; its paths are its names
    state_only: bool = False
    plain_paths: bool = False
    cost: CostModel | None = None  # its cost bound over what it reads (see _cost)

    def evaluate(self, scope: Lookup) -> Any:
        """Evaluate against ``scope`` (state fields + config + run).

        Raises EvaluationError naming the missing field or the type problem.
        """
        return self.decide(scope)[0]

    def decide(self, scope: Lookup) -> tuple[Any, dict[str, Any]]:
        """`evaluate`, and the values of the paths read (for the edge decision record).

        (One function, not three: it runs for every conditional edge of every step.)
        """
        context: dict[str, Any] = {}
        sized = True  # only numbers, booleans and null: its cost is its source's
        for name in self.names:  # the evaluation context: just the names it reads
            try:
                value = context[name] = scope[name]
            except KeyError:
                raise EvaluationError(
                    f"reads {name!r}, which is not in the state (no node has written it yet "
                    "and the run's input did not provide it)"
                ) from None
            if value.__class__ not in _SCALARS:
                sized = False
        if not sized and self.cost is not None:
            self._bound(context)
        try:
            value = self.program.execute(context)
        except KeyError as exc:
            raise EvaluationError(f"no such key: {exc.args[0]!r} "
                                  "(use has(x.y) to test for presence)") from None
        except (RuntimeError, TypeError, ValueError) as exc:
            raise EvaluationError(str(exc).split(". ")[0] + _what_it_read(self.paths, context)
                                  ) from None
        if self.plain_paths:  # it reads whole fields: what it read is its context
            return value, context
        # the context holds every top-level name read: a plain name is a lookup
        return value, {path: context[path] if path in context else _resolve(context, path)
                       for path in self.paths}


    def _bound(self, context: dict[str, Any]) -> None:
        """Refuse the evaluation if its estimated cost passes EXPRESSION_COST."""
        global heavy
        assert self.cost is not None
        limit = EXPRESSION_COST.get()
        cost, sizes = self.cost.estimate(context, limit)
        if cost > YIELD_COST:
            heavy += 1
        if cost <= limit:
            return
        read = ", ".join(f"{name} ({_describe(value, sizes[name])})"
                         for name, value in context.items() if name in sizes)
        over = "at least " if cost > limit and any(
            s.cost > limit for s in sizes.values()) else ""
        raise ExpressionCostError(
            f"its estimated cost is {over}{cost:_} units (about {cost / 1e5:.0f} ms here) "
            f"over the values it reads: {read}; the limit is {limit:_} "
            f"({EXPRESSION_COST.env} raises it) -- move the computation into a node, or "
            "keep the values it iterates over smaller", cost=cost, limit=limit)


#: estimated costs past this give the event loop a turn after the decision (~1 ms)
YIELD_COST = 100_000
heavy = 0  # evaluations estimated past YIELD_COST so far (the runner yields after one)
_SCALARS = frozenset({int, float, bool, type(None)})


class ExpressionCostError(EvaluationError):
    """An evaluation was refused: its estimated cost passes EXPRESSION_COST."""

    def __init__(self, message: str, *, cost: int, limit: int) -> None:
        super().__init__(message)
        self.cost = cost
        self.limit = limit


def _describe(value: object, size: Size) -> str:
    if isinstance(value, str):
        return f"a string of {len(value):_} characters"
    if isinstance(value, dict | list | tuple):
        kind = "a map" if isinstance(value, dict) else "a list"
        return f"{kind} of {len(value):_} entries, largest length inside {size.length:_}"
    return type(value).__name__


def _what_it_read(paths: tuple[str, ...], context: dict[str, Any]) -> str:
    """`` -- x is an int (1), which has no field 'foo'``: the type and value of each path
    an expression read, for an evaluation that failed on a type ("No such overload")."""
    said = []
    for path in paths:
        head, *rest = path.split(".")
        if head not in context:
            continue
        cur, at, lacks = context[head], head, None
        for part in rest:
            if not isinstance(cur, Mapping):
                lacks = f", which has no field {part!r}"
                break
            if part not in cur:
                lacks = f", which has no key {part!r}"
                break
            cur, at = cur[part], f"{at}.{part}"
        said.append(f"{at} is {_kind(cur)}{lacks or ''}")
    return f" -- {'; '.join(dict.fromkeys(said))}" if said else ""


def _kind(value: object) -> str:
    """``an int (1)``, ``a string ("abc")``, ``a map with keys a, b``: for an error."""
    if isinstance(value, Mapping):
        keys = ", ".join(map(str, list(value)[:6])) + (", ..." if len(value) > 6 else "")
        return f"a map with keys {keys}" if keys else "an empty map"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    if value is None:
        return "null"
    name = {bool: "a bool", int: "an int", float: "a float (CEL double)", str: "a string",
            bytes: "bytes"}.get(type(value), f"a {type(value).__name__}")
    import json

    try:
        shown = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        shown = repr(value)
    return f"{name} ({shown if len(shown) <= 40 else shown[:37] + '...'})"


_MISSING = "<missing>"


def _resolve(scope: Lookup, path: str) -> Any:
    head, *rest = path.split(".")
    if head not in scope:
        return _MISSING
    cur: Any = scope[head]
    for part in rest:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return _MISSING
    return cur


def compile_expression(source: str) -> Expression:
    """Compile and bound ``source``. Raises ExpressionSyntaxError with a column."""
    if not isinstance(source, str) or not source.strip():
        raise ExpressionSyntaxError("an expression must be a non-empty string")
    if len(source) > MAX_LENGTH:
        raise ExpressionSyntaxError(
            f"expression is {len(source)} characters long; the limit is {MAX_LENGTH}"
        )
    blanked = _blank_strings(source)
    _check_macros(blanked)
    try:
        program = _cel_module().compile(source)
    except ValueError as exc:
        err = _syntax_error(source, str(exc))
        single = _SINGLE_EQ_RE.search(blanked)
        if single is not None:  # `severity = "high"`: a comparison is written ==
            err = ExpressionSyntaxError(f"{err.args[0]} -- a comparison is written '==' in "
                                        "CEL, not '='", single.start() + 1)
        raise err from None
    iter_vars = set(_ITER_VAR_RE.findall(blanked))
    variables = program.references()["variables"]
    names = tuple(sorted(v for v in variables if v not in iter_vars and not v.startswith("@")))
    paths = []
    for m in _PATH_RE.finditer(blanked):
        path, call = m.group(1), m.group(2)
        head = path.split(".")[0]
        if head in names and head not in _KEYWORDS:
            if call:  # ``a.b.size()`` reads a.b; ``size(a)`` reads a
                path = path.rsplit(".", 1)[0] if "." in path else path
            paths.append(path)
    unique = tuple(dict.fromkeys(paths))
    return Expression(source, names, unique, program,
                      state_only="config" not in names and "run" not in names,
                      plain_paths=frozenset(unique) == frozenset(names),
                      cost=CostModel(source) if names else None)


_SINGLE_EQ_RE = re.compile(r"(?<![=!<>])=(?!=)")


def _blank_strings(source: str) -> str:
    """Replace string literals with spaces of the same length (keeps columns)."""
    return _STRING_RE.sub(lambda m: " " * len(m.group(0)), source)


def _check_macros(blanked: str) -> None:
    macros = list(_MACRO_RE.finditer(blanked))
    if len(macros) > MAX_MACROS:
        raise ExpressionSyntaxError(
            f"expression uses {len(macros)} comprehensions (all/exists/map/filter); "
            f"the limit is {MAX_MACROS}: move the computation into a node",
            macros[MAX_MACROS].start() + 1,
        )
    # Nesting: a macro whose opening parenthesis lies inside another macro's arguments.
    for outer in macros:
        depth, i = 0, outer.end() - 1
        end = len(blanked)
        for j in range(i, len(blanked)):
            if blanked[j] == "(":
                depth += 1
            elif blanked[j] == ")":
                depth -= 1
                if depth == 0:
                    end = j
                    break
        inner = [m for m in macros if outer.end() <= m.start() < end]
        if inner:
            raise ExpressionSyntaxError(
                "nested comprehensions are not allowed (their cost grows with the product "
                "of the list sizes): move the computation into a node",
                inner[0].start() + 1,
            )


def _syntax_error(source: str, text: str) -> ExpressionSyntaxError:
    # The CEL error reads "... ERROR: <input>:1:4: Syntax error: ...\n| a +\n| ...^"
    m = re.search(r"<input>:(\d+):(\d+):\s*(.*)", text)
    if m:
        detail = m.group(3).strip()
        return ExpressionSyntaxError(f"does not compile: {detail}", int(m.group(2)))
    return ExpressionSyntaxError(f"does not compile: {text.splitlines()[0]}")
