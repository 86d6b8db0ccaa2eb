"""Being told by the kernel that files were written, instead of looking at them: Linux's
inotify, through the C library (`ctypes`; nothing to install).

`FileEvents` watches one directory for writes to, creations of and renames onto the
files of the given names, and gives a file descriptor an event loop can wait on
(`asyncio.AbstractEventLoop.add_reader`): it is readable when one of them was written
since `FileEvents.drain` last emptied it. Elsewhere than on Linux, or when the kernel
refuses (its limit on watches or instances reached, the directory missing), `open`
returns None and the caller keeps looking for itself.

An event says only that a write happened, not that what the writer commits is visible
yet (SQLite writes a commit's frames to its WAL, then publishes them in the shared WAL
index): a caller looks again for a short while after an event (see
`interlock._store._sqlite_watch`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import sys
from pathlib import Path

IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000  # events were dropped: any file may have been written
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then name


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):  # no C library, or one without inotify
        return None
    return libc


class FileEvents:
    """Writes to the files ``names`` of one directory, told by inotify (see the module)."""

    def __init__(self, fd: int, names: set[bytes]) -> None:
        self.fd, self.names = fd, names

    @classmethod
    def open(cls, directory: Path, names: list[str]) -> FileEvents | None:
        """Watching ``directory`` for ``names``, or None where inotify cannot."""
        libc = _libc()
        if libc is None:
            return None
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, os.fsencode(directory),
                                  IN_MODIFY | IN_CREATE | IN_MOVED_TO) < 0:
            os.close(fd)
            return None
        return cls(fd, {os.fsencode(name) for name in names})

    def drain(self) -> bool:
        """Read every event waiting; whether one was about our files."""
        ours = False
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return ours
            except OSError:
                return True  # (closed under us: let the caller look)
            at = 0
            while at + _HEADER.size <= len(data):
                _, mask, _, size = _HEADER.unpack_from(data, at)
                name = data[at + _HEADER.size:at + _HEADER.size + size].rstrip(b"\0")
                ours = ours or name in self.names or bool(mask & IN_Q_OVERFLOW)
                at += _HEADER.size + size

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


__all__ = ["FileEvents"]
