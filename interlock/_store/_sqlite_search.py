"""`SQLiteStore.search_messages`: an FTS5 table of the conversations' messages.

``chat_search`` (FTS5: the text, with the run's key, the record's seq and its kind) and
``chat_search_progress`` (per run, the last seq indexed) are created by the first search
(IF NOT EXISTS: no schema version change, like ``cursors``; a file that never searched has
neither). A search first indexes what the workflow's runs appended since (a range scan of
each such run's entries), then asks FTS5, best match (bm25) first."""

from __future__ import annotations

import sqlite3

from ._search import Found, kind_of
from ._sqlite_sql import SEQ_BITS, SEQ_MASK

_TABLES = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS chat_search USING fts5("
    "text, run_key UNINDEXED, seq UNINDEXED, type UNINDEXED)",
    "CREATE TABLE IF NOT EXISTS chat_search_progress ("
    "run_key INTEGER PRIMARY KEY, seq INTEGER NOT NULL)",
)
_TEXT = ("CASE json_extract(data, '$.type') WHEN 'chat.message' THEN "
         "json_extract(data, '$.text') ELSE json_extract(data, '$.reply') END")


def search(conn: sqlite3.Connection, workflow: str, words: list[str], limit: int,
           exclude: str | None) -> list[Found]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in _TABLES:
            conn.execute(statement)
        behind = conn.execute(
            "SELECT r.run_key, r.last_seq, COALESCE(p.seq, 0) FROM runs r "
            "LEFT JOIN chat_search_progress p ON p.run_key = r.run_key "
            "WHERE r.workflow = ? AND r.last_seq > COALESCE(p.seq, 0)",
            (workflow,)).fetchall()
        for key, last, done in behind:
            conn.execute(
                f"INSERT INTO chat_search (text, run_key, seq, type) "
                f"SELECT {_TEXT}, ?, id & {SEQ_MASK}, json_extract(data, '$.type') "
                f"FROM entries WHERE id BETWEEN ? AND ? "
                "AND json_extract(data, '$.type') IN ('chat.message', 'chat.reply') "
                f"AND {_TEXT} IS NOT NULL",
                (key, (key << SEQ_BITS) | (done + 1), (key << SEQ_BITS) | SEQ_MASK))
            conn.execute("INSERT INTO chat_search_progress (run_key, seq) VALUES (?, ?) "
                         "ON CONFLICT (run_key) DO UPDATE SET seq = excluded.seq",
                         (key, last))
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
