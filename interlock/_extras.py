"""How to install one of interlock's optional extras, said right for the way this
interlock was installed: from a checkout (``pip install -e``, as README says) the
checkout's own extra, else the package's."""

from __future__ import annotations

from pathlib import Path


def install_hint(extra: str) -> str:
    """The command that installs the extra ``extra`` (``postgres``, ``server``, ...) for
    this interlock: ``pip install -e '/path/to/checkout[postgres]'`` when it runs from a
    source checkout -- there ``interlock[...]`` would fetch a package of that name from
    the index, which need not be this one -- else ``pip install 'interlock[postgres]'``."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "interlock" / "__init__.py").is_file():
        return f"pip install -e '{root}[{extra}]'"
    return f"pip install 'interlock[{extra}]'"
