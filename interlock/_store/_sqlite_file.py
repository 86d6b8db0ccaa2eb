"""The SQLite store's file: opening it (a new one turned to WAL, one not ours refused
without a write, an older one upgraded in place), what SQLite's errors mean to a user of
the store, and closing it.

Everything here runs on the store's writer thread (`interlock._store._sqlite_thread`),
the one thread the connection is used on at a time (the writer lends it to the event
loop's thread while idle: `interlock._store._sqlite_inline`); the state it reads and
sets is `SQLiteStore`'s (its ``__init__``).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from ._base import StoreError
from ._rows import SCHEMA_NAME
from ._sqlite_sql import (
    SCHEMA_STATEMENTS,
    SCHEMA_VERSION,
    disk_full,
    sqlite_error,
)
from ._sqlite_thread import _Checkpointer
from ._sqlite_upgrade import _reclaim_after_upgrade, _upgrade_from_1, _upgrade_from_2


class SQLiteFile:
    """The connection of a `SQLiteStore` to its file (see the module)."""

    # set by `SQLiteStore.__init__`; the connection and the checkpointer are the writer
    # thread's only
    path: Path
    _synchronous: str
    _busy_ms: int
    _conn: sqlite3.Connection | None
    _checkpointer: _Checkpointer | None
    _space_wanted: bool

    def _error(self, exc: sqlite3.Error, what: str = "SQLite store") -> StoreError:
        if disk_full(exc):
            self._space_wanted = True  # (the writer gives the WAL's space back: `_run`)
        return sqlite_error(self.path, exc, self._busy_ms, what)

    def _open(self) -> sqlite3.Connection:
        path = self.path
        fresh = not path.exists() or path.stat().st_size == 0  # no database in it yet
        if not fresh:
            self._inspect(path)
        else:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the directory of the store {path}: {exc}"
                ) from None
        try:
            conn = sqlite3.connect(path, isolation_level=None, timeout=self._busy_ms / 1000,
                                   check_same_thread=False)  # (lent: `_sqlite_inline`)
        except sqlite3.Error as exc:
            raise self._error(exc, "cannot open the SQLite store") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            if fresh:
                # Turning a new, empty file to WAL is a rollback-journal transaction:
                # with SQLite's default synchronous=FULL, four fsyncs (~half the cost of
                # opening a new store here) to make an empty file durable. A crash in it
                # leaves an empty file; the schema below is committed as configured.
                conn.execute("PRAGMA synchronous = OFF")
            self._to_wal(conn)
            conn.execute(f"PRAGMA synchronous = {self._synchronous.upper()}")
            # The version is read again, and the file upgraded, inside one write
            # transaction: the upgrade is all or nothing (a crash leaves the older
            # version, which the next open upgrades), and another process opening the
            # file at the same time waits for it and then finds the new version.
            conn.execute("BEGIN IMMEDIATE")
            # again: another process may have raced us (or upgraded the file meanwhile)
            version = self._check_tables(conn, path)
            upgraded = version == 1
            if upgraded:
                _upgrade_from_1(conn, path)
            elif version == 2:
                _upgrade_from_2(conn, path)
            for statement in SCHEMA_STATEMENTS:
                conn.execute(statement)
            conn.execute("INSERT OR IGNORE INTO interlock_meta VALUES ('schema', ?), "
                         "('version', ?)", (SCHEMA_NAME, str(SCHEMA_VERSION)))
            conn.execute("UPDATE interlock_meta SET value = ? WHERE key = 'version'",
                         (str(SCHEMA_VERSION),))
            conn.execute("COMMIT")
            if upgraded:
                _reclaim_after_upgrade(conn, path)
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # the checkpointer's job
        except BaseException as exc:
            if conn.in_transaction:
                conn.rollback()
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc, "cannot open the SQLite store") from None
            raise
        self._conn = conn
        self._checkpointer = _Checkpointer(path, f"interlock-sqlite-checkpoint:{path.name}")
        return conn

    def _to_wal(self, conn: sqlite3.Connection) -> None:
        """``PRAGMA journal_mode = WAL``, retried while another connection holds the file.

        Two connections turning a new file to WAL at once both hold a shared lock and
        want an exclusive one: SQLite refuses one at once with "database is locked"
        rather than wait (a deadlock), whatever the busy timeout. Processes opening one
        new store together are common (a worker pool, two CLI runs), so retry -- on the
        writer thread, within the busy timeout -- as the busy handler would.
        """
        deadline = time.monotonic() + self._busy_ms / 1000
        pause = 0.0005
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL").fetchall()
                return
            except sqlite3.OperationalError as exc:
                text = str(exc)
                if ("locked" not in text and "busy" not in text) \
                        or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _inspect(self, path: Path) -> None:
        """Refuse, without writing to it, a file that is not ours.

        The file is read through SQLite only, never with a descriptor of our own: on
        POSIX, closing *any* descriptor of a file drops every lock the process holds on
        it, so a raw ``open()``/``close()`` would silently release the locks of this
        process's other connections to the same database -- and another process closing
        its connection would then think it is the last one and delete the WAL they use.
        """
        if path.is_dir():  # (SQLite says only "disk I/O error")
            raise StoreError(f"cannot open the SQLite store {path}: it is a directory; a "
                             f"store is a file, such as sqlite:///{path / 'runs.db'}")
        try:
            ro = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                                 isolation_level=None, timeout=self._busy_ms / 1000)
        except sqlite3.Error as exc:
            raise self._error(exc, "cannot open the SQLite store") from None
        try:
            self._check_tables(ro, path)
        finally:
            ro.close()

    @staticmethod
    def _check_tables(conn: sqlite3.Connection, path: Path) -> int | None:
        """The file's schema version (None: no tables yet), if it is an interlock store
        this interlock understands; otherwise `StoreError`."""
        try:
            tables = {name for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%'")}
            meta: dict[str, str] = {}
            if "interlock_meta" in tables:
                meta = dict(conn.execute("SELECT key, value FROM interlock_meta"))
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc):
                raise StoreError(
                    f"{path} is not a SQLite database (and so not an interlock store); "
                    "refusing to touch it -- point the store URL at another file"
                ) from None
            if "readonly" in str(exc):
                raise sqlite_error(path, exc, 0, "cannot open the SQLite store") from None
            raise StoreError(
                f"{path} is not a usable SQLite database ({exc}); refusing to touch it"
            ) from None
        if not tables:
            return None
        if meta.get("schema") != SCHEMA_NAME:
            raise StoreError(
                f"{path} is a SQLite database of something else (tables: "
                f"{', '.join(sorted(tables))}), not an interlock store; refusing to touch it "
                "-- point the store URL at another file"
            )
        version = meta.get("version", "")
        if not version.isdigit() or int(version) > SCHEMA_VERSION:
            raise StoreError(
                f"{path} is an interlock store of schema version {version!r}, newer than "
                f"this interlock understands ({SCHEMA_VERSION}); upgrade interlock"
            )
        return int(version)

    def _close_conn(self) -> None:
        # the checkpointer's connection first: the last one to close checkpoints the
        # whole WAL into the file and removes it
        ck, self._checkpointer = self._checkpointer, None
        if ck is not None:
            ck.stop()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

