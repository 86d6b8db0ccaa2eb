"""`PostgresStore.search_messages`: PostgreSQL full-text search over the conversations'
messages.

``chat_search`` (the text and its ``tsvector``, under a GIN index, by run and seq) and
``chat_search_progress`` (per run, the last seq indexed) are created by the first search
(IF NOT EXISTS). A search first indexes what the workflow's runs appended since, then
ranks the matches of any of the query's words (``ts_rank``)."""

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
    """CREATE TABLE IF NOT EXISTS chat_search_progress (
        run_id text PRIMARY KEY,
        seq    bigint NOT NULL
    )""",
)
_TEXT = ("CASE rec.type WHEN 'chat.message' THEN rec.data::jsonb ->> 'text' "
         "ELSE rec.data::jsonb ->> 'reply' END")


async def search(conn: Any, workflow: str, words: list[str], limit: int,
                 exclude: str | None) -> list[Found]:
    for statement in TABLES:
        try:
            async with conn.transaction():
                await conn.execute(statement)
        except Exception as exc:  # two first searches at once: the other one created it
            import psycopg

            if not isinstance(exc, psycopg.errors.UniqueViolation | psycopg.errors.DuplicateTable
                              | psycopg.errors.DuplicateObject):
                raise
    async with conn.transaction():
        cur = await conn.execute(
            "SELECT r.run_id, r.last_seq, COALESCE(p.seq, 0) FROM runs r "
            "LEFT JOIN chat_search_progress p ON p.run_id = r.run_id "
            "WHERE r.workflow = %s AND r.last_seq > COALESCE(p.seq, 0)",
            (workflow,))
        for run_id, last, done in await cur.fetchall():
            await conn.execute(
                f"INSERT INTO chat_search (run_id, seq, type, text, tsv) "
                f"SELECT rec.run_id, rec.seq, rec.type, {_TEXT}, "
                f"to_tsvector('english', {_TEXT}) FROM records rec "
                "WHERE rec.run_id = %s AND rec.seq > %s "
                "AND rec.type IN ('chat.message', 'chat.reply') "
                f"AND {_TEXT} IS NOT NULL ON CONFLICT DO NOTHING", (run_id, done))
            await conn.execute(
                "INSERT INTO chat_search_progress (run_id, seq) VALUES (%s, %s) "
                "ON CONFLICT (run_id) DO UPDATE SET "
                "seq = GREATEST(chat_search_progress.seq, excluded.seq)", (run_id, last))
    query = " | ".join(words)  # (words are \w+: no operator to escape)
    cur = await conn.execute(
        "SELECT s.run_id, s.seq, s.type, s.text FROM chat_search s "
        "JOIN runs r ON r.run_id = s.run_id, to_tsquery('english', %s) q "
        "WHERE s.tsv @@ q AND r.workflow = %s AND r.run_id IS DISTINCT FROM %s "
        "ORDER BY ts_rank(s.tsv, q) DESC, r.created_at DESC, s.seq LIMIT %s",
        (query, workflow, exclude, limit))
    return [Found(str(run_id), int(seq), kind_of(str(rtype)), str(text))
            for run_id, seq, rtype, text in await cur.fetchall()]
