"""`SQLiteStore.search_messages`: an FTS5 table of the conversations' messages.

``chat_search`` (FTS5: the text, with the run's key, the record's seq and its kind; its
rowid is the record's ``entries.id``) is filled by the store's writer in the transaction
that appends the messages (`index`, from `_sqlite_writes`), so a search only reads it; a
pruned run's rows go with its records (`forget`). The table is created by the first
write of a message or the first search (IF NOT EXISTS: no schema version change, like
``cursors``): then filled once from the log (the messages written before it), and an
index of an earlier version -- filled at search time, with ``chat_search_progress`` --
is rebuilt the same way."""

from __future__ import annotations

import sqlite3

import orjson

from .._log import Entry
from ._search import CHAT_TYPES, Found, kind_of
from ._sqlite_sql import SEQ_BITS, SEQ_MASK

_CREATE = ("CREATE VIRTUAL TABLE chat_search USING fts5("
           "text, run_key UNINDEXED, seq UNINDEXED, type UNINDEXED)")
_TEXT = ("CASE json_extract(data, '$.type') WHEN 'chat.message' THEN "
         "json_extract(data, '$.text') ELSE json_extract(data, '$.reply') END")
_FILL = (f"INSERT INTO chat_search (rowid, text, run_key, seq, type) "
         f"SELECT id, {_TEXT}, id >> {SEQ_BITS}, id & {SEQ_MASK}, json_extract(data, '$.type') "
         "FROM entries WHERE json_extract(data, '$.type') IN ('chat.message', 'chat.reply') "
         f"AND {_TEXT} IS NOT NULL")
_CHAT = frozenset(CHAT_TYPES)


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE name IN ('chat_search', 'chat_search_progress')")}


def ready(conn: sqlite3.Connection) -> bool:
    """Make ``chat_search`` the index of every message in the log, in the caller's write
    transaction; True when it was (re)built now -- from the log as it is, the caller's
    own records included."""
    tables = _tables(conn)
    if tables == {"chat_search"}:
        return False
    conn.execute("DROP TABLE IF EXISTS chat_search_progress")  # (an earlier version's)
    conn.execute("DROP TABLE IF EXISTS chat_search")
    conn.execute(_CREATE)
    conn.execute(_FILL)
    return True


def index(conn: sqlite3.Connection, run_key: int, entries: list[Entry]) -> None:
    """Index the messages among ``entries``, just inserted for run ``run_key`` in this
    transaction (nothing to do, and nothing parsed, for a batch without one)."""
    chat = [e for e in entries if e.type in _CHAT]
    if not chat or ready(conn):
        return
    base = run_key << SEQ_BITS
    rows = []
    for e in chat:
        rec = orjson.loads(e.data)
        text = rec.get("text") if e.type == "chat.message" else rec.get("reply")
        if isinstance(text, str):
            rows.append((base | e.seq, text, run_key, e.seq, e.type))
    conn.executemany("INSERT INTO chat_search (rowid, text, run_key, seq, type) "
                     "VALUES (?, ?, ?, ?, ?)", rows)


def forget(conn: sqlite3.Connection, run_key: int) -> None:
    """Remove a pruned run's messages from the index (its rowids are its entries' ids)."""
    if "chat_search" in _tables(conn):
        conn.execute("DELETE FROM chat_search WHERE rowid BETWEEN ? AND ?",
                     (run_key << SEQ_BITS, (run_key << SEQ_BITS) | SEQ_MASK))


def search(conn: sqlite3.Connection, workflow: str, words: list[str], limit: int,
           exclude: str | None) -> list[Found]:
    if _tables(conn) != {"chat_search"}:  # never written, or an earlier version's
        conn.execute("BEGIN IMMEDIATE")
        try:
            ready(conn)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    match = " OR ".join(f'"{w}"' for w in words)  # (words are \w+: nothing to escape)
    rows = conn.execute(
        "SELECT r.run_id, s.seq, s.type, s.text FROM chat_search s "
        "JOIN runs r ON r.run_key = s.run_key "
        "WHERE chat_search MATCH ? AND r.workflow = ? AND r.run_id IS NOT ? "
        "ORDER BY bm25(chat_search), r.created_at DESC, s.seq LIMIT ?",
        (match, workflow, exclude, limit)).fetchall()
    return [Found(str(run_id), int(seq), kind_of(str(rtype)), str(text))
            for run_id, seq, rtype, text in rows]
