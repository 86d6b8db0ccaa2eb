"""`PostgresStore.search_messages`: PostgreSQL full-text search over the conversations'
messages.

``chat_search`` (the text and its ``tsvector``, under a GIN index, by run and seq) is
filled by the database as the messages are written: a trigger on ``records`` (``AFTER
INSERT``, only for ``chat.message``/``chat.reply`` rows) inserts each one in the
transaction that appends it, whatever statement appends it (an append, a group commit,
a new run, a fork, an import). A search only reads it; a pruned run's rows go with its
records (`forget`). The table, function and trigger are made by the first write of a
message or the first search of a process that finds them missing (`ready`), which then
fills the table from the log once -- under a lock that holds appends back meanwhile, so
no message falls between the fill and the trigger; an index of an earlier version
(filled at search time, with ``chat_search_progress``) is completed the same way."""

from __future__ import annotations

from typing import Any

from ._search import Found, kind_of

TABLES = (
    """CREATE TABLE IF NOT EXISTS chat_search (
        run_id text NOT NULL,
        seq    bigint NOT NULL,
        type   text NOT NULL,
        text   text NOT NULL,
        tsv    tsvector NOT NULL,
        PRIMARY KEY (run_id, seq)
    )""",
    "CREATE INDEX IF NOT EXISTS chat_search_tsv ON chat_search USING gin (tsv)",
)
_TEXT = ("CASE {r}.type WHEN 'chat.message' THEN {r}.data::jsonb ->> 'text' "
         "ELSE {r}.data::jsonb ->> 'reply' END")
_FUNCTION = f"""CREATE OR REPLACE FUNCTION interlock_chat_search_fill() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE body text := {_TEXT.format(r="NEW")};
BEGIN
    IF body IS NOT NULL THEN
        INSERT INTO chat_search (run_id, seq, type, text, tsv)
        VALUES (NEW.run_id, NEW.seq, NEW.type, body, to_tsvector('english', body))
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$"""
_TRIGGER = ("CREATE TRIGGER interlock_chat_search AFTER INSERT ON records FOR EACH ROW "
            "WHEN (NEW.type IN ('chat.message', 'chat.reply')) "
            "EXECUTE FUNCTION interlock_chat_search_fill()")
_HAS_TRIGGER = ("SELECT 1 FROM pg_trigger WHERE tgname = 'interlock_chat_search' "
                "AND tgrelid = to_regclass('records')")
_FILL = (f"INSERT INTO chat_search (run_id, seq, type, text, tsv) "
         f"SELECT rec.run_id, rec.seq, rec.type, {_TEXT.format(r='rec')}, "
         f"to_tsvector('english', {_TEXT.format(r='rec')}) FROM records rec "
         "WHERE rec.type IN ('chat.message', 'chat.reply') "
         f"AND {_TEXT.format(r='rec')} IS NOT NULL ON CONFLICT DO NOTHING")


async def ready(conn: Any) -> None:
    """Make ``chat_search`` and its trigger if they are missing, the table filled from
    the log (see the module)."""
    if await (await conn.execute(_HAS_TRIGGER)).fetchone() is not None:
        return
    async with conn.transaction():
        # appends wait until this commits: none lands between the fill and the trigger,
        # and two processes doing this at once do it one after the other
        await conn.execute("LOCK TABLE records IN SHARE ROW EXCLUSIVE MODE")
        if await (await conn.execute(_HAS_TRIGGER)).fetchone() is not None:
            return
        for statement in (*TABLES, _FUNCTION, _TRIGGER, _FILL,
                          "DROP TABLE IF EXISTS chat_search_progress"):
            await conn.execute(statement)


async def forget(conn: Any, run_ids: list[str]) -> None:
    """Remove pruned runs' messages from the index (in the prune's transaction)."""
    cur = await conn.execute("SELECT to_regclass('chat_search') IS NOT NULL")
    row = await cur.fetchone()
    if row is not None and row[0]:
        await conn.execute("DELETE FROM chat_search WHERE run_id = ANY(%s)", (run_ids,))


async def search(conn: Any, workflow: str, words: list[str], limit: int,
                 exclude: str | None) -> list[Found]:
    await ready(conn)
    query = " | ".join(words)  # (words are \w+: no operator to escape)
    cur = await conn.execute(
        "SELECT s.run_id, s.seq, s.type, s.text FROM chat_search s "
        "JOIN runs r ON r.run_id = s.run_id, to_tsquery('english', %s) q "
        "WHERE s.tsv @@ q AND r.workflow = %s AND r.run_id IS DISTINCT FROM %s "
        "ORDER BY ts_rank(s.tsv, q) DESC, r.created_at DESC, s.seq LIMIT %s",
        (query, workflow, exclude, limit))
    return [Found(str(run_id), int(seq), kind_of(str(rtype)), str(text))
            for run_id, seq, rtype, text in await cur.fetchall()]
