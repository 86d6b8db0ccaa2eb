"""Where in the user's code an exception came from: the innermost frame of its
traceback that is neither interlock's, nor the standard library's, nor an installed
package's (``site-packages``) -- ``nodes.py:8 in boom``.

A node's error message carries it (``node 'a' raised ValueError: kaboom (at nodes.py:8
in boom)``) so that the line a person reads first points at their code; the full
traceback stays in the error's details. Used in the engine's process (`_guards`), in
an isolated node's worker process (`_isolation._worker`) and on a Ray worker (`_ray`:
`carry` notes the frame on the exception, which travels pickled without its
traceback), so it imports only the standard library.
"""

from __future__ import annotations

import functools
import os
import traceback

# the attribute `carry` sets: where an exception raised in another process came from
_CARRIED = "_interlock_at"

# interlock's own package folder, with the separator: its frames are never the user's
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@functools.cache
def _not_users() -> tuple[str, ...]:
    """interlock's folder and the standard library's and installed packages' (found on
    the first error, not at import: the engine's start-up does not pay for it)."""
    import sysconfig

    paths = sysconfig.get_paths()
    found = {os.path.abspath(paths[k]) + os.sep
             for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
    return (_OWN, *sorted(found))


def user_frame(exc: BaseException) -> str | None:
    """``FILE:LINE in FUNCTION`` of the innermost frame of the user's code in ``exc``'s
    traceback (FILE relative to the working directory when it is below it), or None
    when every frame is interlock's or a library's (an error interlock raised itself).
    An exception raised in another process says where with what `carry` noted there."""
    carried = getattr(exc, "__dict__", {}).get(_CARRIED)
    if isinstance(carried, str):
        return carried
    found = None
    not_users = _not_users()
    for frame, line in traceback.walk_tb(exc.__traceback__):
        path = frame.f_code.co_filename
        if path.startswith("<") or os.path.abspath(path).startswith(not_users):
            continue
        found = (path, line, frame.f_code.co_name)
    if found is None:
        return None
    path, line, name = found
    try:
        shown = os.path.relpath(path)
        if shown.startswith(os.pardir):
            shown = path
    except ValueError:  # another drive (Windows)
        shown = path
    return f"{shown}:{line} in {name}"


def carry(exc: BaseException) -> None:
    """Note ``exc``'s `user_frame` on it, in the process that raised it, when it goes to
    another one pickled (a Ray task's exception): its traceback is not pickled, but its
    attributes are, and `user_frame` reads them there."""
    try:
        at = user_frame(exc)
        if at is not None:
            setattr(exc, _CARRIED, at)
    except Exception:  # (an exception that takes no attribute: it goes without)
        pass


def located(message: str, at: str | None) -> str:
    """``message`` with `` (at FILE:LINE in FUNCTION)`` when ``at`` is known."""
    return f"{message} (at {at})" if at else message


def unlocated(message: str, at: object) -> str:
    """``message`` without what `located` added (an error edge's target gets the
    exception's own message)."""
    # (a mapped node's item says which item after it)
    return message.replace(f" (at {at})", "", 1) if isinstance(at, str) and at else message
