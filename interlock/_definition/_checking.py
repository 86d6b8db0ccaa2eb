"""The shared state of one validation: what every family of checks reads and reports to.

`CheckContext` holds the workflow being checked, the functions a builder gave and
the node kinds; it reports a finding (`add`, with the ``file:line:col`` of the path
it names) and resolves a call path once (`resolve`). Its `CheckResult` gathers the
diagnostics and what was resolved along the way (callables, compiled expressions,
the concurrency of the nodes). The checks themselves are the `_checks_*` modules';
`_validate.check` runs them. A node kind's check sees this object as `_kinds.Checker`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._errors import Diagnostic, Severity
from ._callables import import_callable
from ._expr import Expression
from ._graph import Concurrency
from ._kinds import NodeKind
from ._model import WorkflowSpec
from ._spec import locate


@dataclass
class CheckResult:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    callables: dict[str, Callable[..., object]] = field(default_factory=dict)
    expressions: dict[str, Expression] = field(default_factory=dict)
    # which nodes can run concurrently (also the run-time write-conflict check's)
    concurrency: Concurrency | None = None

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "warning"]


class CheckContext:
    def __init__(self, spec: WorkflowSpec, provided: dict[str, Callable[..., object]],
                 kinds: Sequence[NodeKind]) -> None:
        self.spec = spec
        self.provided = provided
        self.kinds = kinds
        self.result = CheckResult()
        # check_repeats: unconditional plain edges seen so far, by their set of sources
        self._plain_targets: dict[frozenset[str], dict[str, int]] = {}

    def add(self, severity: Severity, message: str, path: tuple[object, ...], code: str) -> None:
        self.result.diagnostics.append(
            Diagnostic(severity, message, locate(self.spec, path), code))

    def resolve(self, path: str, where: tuple[object, ...], what: str) -> None:
        if path in self.result.callables:
            return
        fn = self.provided.get(path)
        if fn is None:
            try:
                fn = import_callable(path)
            except (ImportError, AttributeError, TypeError) as exc:
                hint = _import_hint(exc, path, locate(self.spec, ()).file)
                self.add("error", f"{what}: call target {path!r} does not import: {exc}{hint}",
                         where, "import")
                return
            except (Exception, SystemExit) as exc:  # importing user code may raise anything
                self.add("error", f"{what}: importing {path!r} raised {type(exc).__name__}: "
                         f"{exc}", where, "import")
                return
        self.result.callables[path] = fn


def _import_hint(exc: BaseException, path: str, workflow_file: str | None) -> str:
    """Where modules import from, when a call target's module is not found: the current
    directory (as with ``python -m``) and PYTHONPATH -- and the folder to run from when the
    module is beside the workflow file."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if not isinstance(cause, ModuleNotFoundError):
        return ""
    top = path.partition(":")[0].split(".")[0]
    if cause.name is not None and cause.name.split(".")[0] != top:
        return ""  # the module was found; something it imports was not
    cwd = Path.cwd()
    hint = (f"; modules import from the current directory ({cwd}) and PYTHONPATH")
    if workflow_file is not None:
        folder = Path(workflow_file).resolve().parent
        for there in (folder, *folder.parents):
            if (there / f"{top}.py").is_file() or (there / top / "__init__.py").is_file():
                if there != cwd:
                    hint += (f": {top!r} is in {there} -- run interlock from there, or "
                             f"PYTHONPATH={there}")
                break
    return hint


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    import difflib

    names = list(known)
    same = [k for k in names if k.lower() == name.lower()]  # `end` for END
    close = same or difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
