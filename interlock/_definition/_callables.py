"""``package.module:attr.attr`` -> the callable it names.

One resolution for the engine (`import_callable`: validation, agents' tools) and for
isolated workers (`_isolation._worker`, which imports only light modules like this one
so that a worker starts fast), with the same messages for people.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def import_module(module_name: str) -> Any:
    """``importlib.import_module``, with an ImportError that names the module."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"cannot import module {module_name!r}: {exc}") from exc


def callable_at(obj: object, path: str) -> Callable[..., object]:
    """The callable the ``attr.attr`` part of ``path`` names inside ``obj`` (its module).

    Raises AttributeError / TypeError with a message for people.
    """
    module_name, _, attr = path.partition(":")
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise TypeError(f"{path} is a {type(obj).__name__}, not a function")
    return obj


def import_callable(path: str) -> Callable[..., object]:
    """Resolve ``package.module:attr.attr`` like uvicorn: the working directory is importable.

    Raises ImportError/AttributeError/TypeError with a message for people.
    """
    module_name = path.partition(":")[0]
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    return callable_at(import_module(module_name), path)
