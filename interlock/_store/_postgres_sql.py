"""The PostgreSQL store's tables and the statements it runs: the schema (its own
version, apart from SQLite's), the advisory lock that serialises creating it, and the SQL
of new runs, appends (one at a time and a turn's together), claims, the queue's claim,
takeovers and heartbeats -- lease times from the server's clock."""

from __future__ import annotations

from ._rows import _RUN_COLUMNS

# The version of this store's own tables, in its interlock_meta (SQLite's file has its own
# number, `_sqlite_sql.SCHEMA_VERSION`: the two layouts change apart). Versions 1 and 2 are the
# same tables here: 2 was written while this store took SQLite's number. Version 3 added
# the runs' claim ``generation`` (`_upgrade` adds the column to an older store's table).
SCHEMA_VERSION = 3

# pg_advisory_xact_lock key serialising schema creation: "ilck" "schm"
_SCHEMA_LOCK = 0x696C636B_7363686D

# poll triggers' cursors (`Store.get_cursor`): a table added to schema version 2, created
# IF NOT EXISTS when a store is opened (an interlock that does not know it ignores it)
_CURSORS = """CREATE TABLE IF NOT EXISTS cursors (
        name       text PRIMARY KEY,
        value      text NOT NULL,
        updated_at double precision NOT NULL
    )"""

# Whether some process listens for appends (`RECORDS_CHANNEL`): a sequence whose value is
# the time (the server's clock, in milliseconds) until which the last listener announced
# itself. A sequence is read outside the statement's snapshot: an append reads its value as
# it is when the append has stored its records, a moment before its commit (see
# `interlock._store._postgres_listen` for why that matters). Created IF NOT EXISTS when a
# store is opened, as ``cursors`` is (an interlock that does not know it ignores it).
_LISTENING = "CREATE SEQUENCE IF NOT EXISTS interlock_listening"
_NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
# a listener's announcement: it listens for ``%s`` seconds more (the latest of all
# listeners' announcements is kept)
ANNOUNCE = (f"SELECT setval('interlock_listening', GREATEST({_NOW_MS} + %s::bigint, "
            "(SELECT last_value FROM interlock_listening)))")
_LISTENED = f"(SELECT last_value FROM interlock_listening) > {_NOW_MS}"

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS interlock_meta (
        key   text PRIMARY KEY,
        value text NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS runs (
        run_id          text PRIMARY KEY,
        workflow        text NOT NULL,
        status          text NOT NULL,
        definition      text NOT NULL,
        definition_hash text NOT NULL,
        input           text NOT NULL,
        options         text NOT NULL,
        created_at      double precision NOT NULL,
        updated_at      double precision NOT NULL,
        last_seq        bigint NOT NULL,
        last_hash       text NOT NULL,
        steps           bigint NOT NULL DEFAULT 0,
        tokens          bigint NOT NULL DEFAULT 0,
        error           text,
        waiting         text,
        parent_run      text,
        parent_seq      bigint,
        owner           text,
        lease_until     double precision,
        extra           text NOT NULL DEFAULT '{}',
        generation      bigint NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX IF NOT EXISTS runs_by_created ON runs (created_at DESC)",
    "CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, created_at DESC)",
    "CREATE INDEX IF NOT EXISTS runs_by_workflow ON runs (workflow, created_at DESC)",
    """CREATE TABLE IF NOT EXISTS records (
        run_id text NOT NULL,
        seq    bigint NOT NULL,
        type   text NOT NULL,
        node   text,
        data   text NOT NULL,
        hash   text NOT NULL,
        PRIMARY KEY (run_id, seq)
    )""",
    """CREATE TABLE IF NOT EXISTS snapshots (
        run_id text PRIMARY KEY,
        seq    bigint NOT NULL,
        data   bytea NOT NULL
    )""",
    _CURSORS,
    _LISTENING,
)

_NOW = "extract(epoch FROM clock_timestamp())::float8"

# The arrays go in binary format (``%(...)b``): in text format each JSON record would be
# quoted and every '"' in it backslash-escaped by a regex substitution, element by
# element -- most of an append's client-side cost.
_UNNEST = (
    "unnest(%(seqs)b::bigint[], %(types)b::text[], %(nodes)b::text[], %(datas)b::text[], "
    "%(hashes)b::text[]) AS u(seq, type, node, data, hash)"
)

_RUN_NAMES = [c.strip() for c in _RUN_COLUMNS.split(",")]
# a new run created claimed (an owner in its row) has its lease counted from the server's
# clock: ``lease_for`` seconds from now
_CREATE_VALUES = ", ".join(
    f"CASE WHEN %(owner)s::text IS NULL THEN %(lease_until)s::float8 ELSE {_NOW} + "
    "%(lease_for)s::float8 END" if name == "lease_until" else f"%({name})s"
    for name in _RUN_NAMES)
# an append's ``release``: the lease given up if that owner holds it
_RELEASE = ("owner = CASE WHEN owner = %(release)s::text THEN NULL ELSE owner END, "
            "lease_until = CASE WHEN owner = %(release)s::text THEN NULL ELSE lease_until END")

_CREATE_RUN = f"""
WITH run AS (
    INSERT INTO runs ({_RUN_COLUMNS})
    VALUES ({_CREATE_VALUES})
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id
), ins AS (
    INSERT INTO records (run_id, seq, type, node, data, hash)
    SELECT run.run_id, u.seq, u.type, u.node, u.data, u.hash FROM run, {_UNNEST}
    RETURNING 1
)
SELECT (SELECT count(*) FROM run), (SELECT count(*) FROM ins)
"""

# Told at the commit of records appended while a listener has announced itself
# (`_LISTENED`: the server's event streams LISTEN, `interlock._store._postgres_listen`;
# with nobody listening an append notifies nothing -- a notifying commit takes a lock,
# cluster-wide, that serialises the commits of every process that notifies): the payload
# names the runs that grew, separated by spaces -- or is empty, meaning "any run", when
# the names would not fit in a payload (8,000 bytes) or one holds a space. NOTIFY is
# transactional: the listeners hear it at the commit, once per transaction and payload,
# and never for a write rolled back.
RECORDS_CHANNEL = "interlock_records"
# (``_LISTENED`` is read in the aggregate's projection: after ``upd`` has run, its rows
# locked and written, so a moment before the commit -- not when the statement began)
_NOTIFY = (f"CASE WHEN {_LISTENED} THEN pg_notify('{RECORDS_CHANNEL}', CASE WHEN "
           "sum(octet_length(run) + 1) > 7900 OR bool_or(strpos(run, ' ') > 0) THEN '' "
           "ELSE string_agg(run, ' ') END) END")

# One statement: the stored log's last seq (`last`), the records inserted only if
# they continue it and the run exists (`ins`), the summary updated only then (`upd`).
# Two writers of the same seq: the second blocks on the primary key until the first
# commits, then fails with UniqueViolation and its whole statement is undone.
# Fencing: ``run`` locks the run's row (FOR UPDATE). A claim commits its generation
# + 1 under that row's lock, so an append either runs first (its claim still current)
# or waits for the claim's commit and, as READ COMMITTED rechecks a locked row, reads
# the new generation and stores nothing (``ok`` false: ClaimLost). Without the lock
# the statement's snapshot could predate a claim that commits before the append does.
_APPEND = f"""
WITH run AS (
    SELECT run_id, generation, owner FROM runs WHERE run_id = %(run)s FOR UPDATE
), last AS (
    SELECT COALESCE(MAX(seq), 0) AS n FROM records WHERE run_id = %(run)s
), ok AS (
    SELECT EXISTS (SELECT 1 FROM run) AND (SELECT n FROM last) = %(prev)s
        AND (%(gen)s::bigint IS NULL OR (SELECT generation FROM run) = %(gen)s::bigint) AS ok
), ins AS (
    INSERT INTO records (run_id, seq, type, node, data, hash)
    SELECT %(run)s, u.seq, u.type, u.node, u.data, u.hash FROM {_UNNEST}
    WHERE (SELECT ok FROM ok)
    RETURNING 1
), upd AS (
    UPDATE runs SET status = %(status)s, updated_at = %(updated_at)s, last_seq = %(last_seq)s,
        last_hash = %(last_hash)s, steps = %(steps)s, tokens = %(tokens)s, error = %(error)s,
        waiting = %(waiting)s, {_RELEASE}
    WHERE run_id = %(run)s AND (SELECT ok FROM ok)
    RETURNING run_id AS run
)
SELECT EXISTS (SELECT 1 FROM run), (SELECT n FROM last), (SELECT count(*) FROM ins),
       (SELECT count(*) FROM upd), (SELECT generation FROM run), (SELECT owner FROM run),
       (SELECT {_NOTIFY} FROM upd HAVING count(*) > 0)
"""

_UPDATE_SUMMARY = f"""
UPDATE runs SET status = %(status)s, updated_at = %(updated_at)s, last_seq = %(last_seq)s,
    last_hash = %(last_hash)s, steps = %(steps)s, tokens = %(tokens)s, error = %(error)s,
    waiting = %(waiting)s, {_RELEASE}
WHERE run_id = %(run)s AND (%(gen)s::bigint IS NULL OR generation = %(gen)s::bigint)
RETURNING 1
"""

# Group commit: the appends of several runs in ONE statement (one transaction, one WAL
# flush). ``b`` has an append per row (its ordinal ``i``, the seq before its records or
# NULL when it has none, its summary), ``e`` the records, each with its append's ``i``.
# An append whose run is missing or whose log does not end at ``prev`` is left out (and
# reported); the others are stored. Two appends of one run never share a statement.
_APPEND_MANY = f"""
WITH b AS (
    SELECT * FROM unnest(%(b_run)b::text[], %(b_prev)b::bigint[], %(b_status)b::text[],
        %(b_updated_at)b::float8[], %(b_last_seq)b::bigint[], %(b_last_hash)b::text[],
        %(b_steps)b::bigint[], %(b_tokens)b::bigint[], %(b_error)b::text[],
        %(b_waiting)b::text[], %(b_release)b::text[], %(b_gen)b::bigint[]) WITH ORDINALITY
        AS b(run, prev, status, updated_at, last_seq, last_hash, steps, tokens, error,
             waiting, release, gen, i)
), lk AS (
    -- the rows locked in one order (run id) by every committer, of every process:
    -- two turns that share runs wait for each other instead of deadlocking
    SELECT run_id, generation, owner FROM runs WHERE run_id = ANY(%(b_run)b::text[])
    ORDER BY run_id FOR UPDATE
), chk AS (
    -- (a join: a subquery on ``lk`` per append would scan it whole each time)
    SELECT b.i, lk.run_id IS NOT NULL AS found,
           (SELECT COALESCE(MAX(seq), 0) FROM records WHERE run_id = b.run) AS n,
           lk.generation AS gen, lk.owner AS owner
    FROM b LEFT JOIN lk ON lk.run_id = b.run
), ok AS (
    SELECT b.* FROM b JOIN chk ON chk.i = b.i
    WHERE chk.found AND (b.prev IS NULL OR chk.n = b.prev)
      AND (b.gen IS NULL OR chk.gen = b.gen)
), ins AS (
    INSERT INTO records (run_id, seq, type, node, data, hash)
    SELECT ok.run, u.seq, u.type, u.node, u.data, u.hash
    FROM unnest(%(of)b::bigint[], %(seqs)b::bigint[], %(types)b::text[],
                %(nodes)b::text[], %(datas)b::text[], %(hashes)b::text[])
         AS u(i, seq, type, node, data, hash)
    JOIN ok ON ok.i = u.i
    RETURNING 1
), upd AS (
    UPDATE runs SET status = ok.status, updated_at = ok.updated_at, last_seq = ok.last_seq,
        last_hash = ok.last_hash, steps = ok.steps, tokens = ok.tokens, error = ok.error,
        waiting = ok.waiting,
        owner = CASE WHEN runs.owner = ok.release THEN NULL ELSE runs.owner END,
        lease_until = CASE WHEN runs.owner = ok.release THEN NULL ELSE runs.lease_until END
    FROM ok WHERE runs.run_id = ok.run
    RETURNING ok.i, ok.run
)
SELECT chk.i, chk.found, chk.n, chk.i IN (SELECT i FROM upd), (SELECT count(*) FROM ins),
       chk.gen, chk.owner, (SELECT {_NOTIFY} FROM upd HAVING count(*) > 0)
FROM chk ORDER BY chk.i
"""

# Several new runs in one statement (in the transaction of a turn's appends): ``u`` the
# rows (``_RUN_COLUMNS`` and ``lease_for``), ``e`` their first records (each with its run
# id). A run whose id is taken is left out (reported); the others are stored.
_TEXT_COLUMNS = {"definition", "input", "options"}  # long JSON: binary, unescaped
_NUMERIC = {"created_at": "float8", "updated_at": "float8", "last_seq": "bigint",
            "steps": "bigint", "tokens": "bigint", "parent_seq": "bigint",
            "lease_until": "float8", "generation": "bigint"}
_CREATE_MANY = f"""
WITH u AS (
    SELECT * FROM unnest({", ".join(
        f"%(c_{n})b::text[]" if n in _TEXT_COLUMNS else f"%(c_{n})s::{_NUMERIC.get(n, 'text')}[]"
        for n in _RUN_NAMES)}, %(c_lease_for)s::float8[]) WITH ORDINALITY
        AS u({", ".join(_RUN_NAMES)}, lease_for, i)
), run AS (
    INSERT INTO runs ({_RUN_COLUMNS})
    SELECT {", ".join(
        f"CASE WHEN u.owner IS NULL THEN u.lease_until ELSE {_NOW} + u.lease_for END"
        if n == "lease_until" else f"u.{n}" for n in _RUN_NAMES)}
    FROM u
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id
), ins AS (
    INSERT INTO records (run_id, seq, type, node, data, hash)
    SELECT run.run_id, e.seq, e.type, e.node, e.data, e.hash
    FROM unnest(%(e_run)b::text[], %(seqs)b::bigint[], %(types)b::text[],
                %(nodes)b::text[], %(datas)b::text[], %(hashes)b::text[])
         AS e(run, seq, type, node, data, hash)
    JOIN run ON run.run_id = e.run
    RETURNING 1
)
SELECT u.i, u.run_id IN (SELECT run_id FROM run), (SELECT count(*) FROM ins)
FROM u ORDER BY u.i
"""

# A claim: a compare-and-set on the row (free, ours, or its lease run out by the
# server's clock; or ``force``). Every claim bumps the generation -- the same owner's
# again too -- and returns it: appends and heartbeats name the generation they act
# under, so once a run is claimed again nothing its earlier executor does is stored.
_CLAIM = f"""
UPDATE runs SET owner = %(owner)s, lease_until = {_NOW} + %(lease)s,
    generation = generation + 1
WHERE run_id = %(run)s AND (%(force)s OR owner IS NULL OR owner = %(owner)s
                            OR lease_until IS NULL OR lease_until <= {_NOW})
RETURNING generation
"""

# the queue's claim: of the runnable runs (`RUNNABLE`, or waiting at a gate whose deadline
# passed or beside branches still to run -- ``waiting.running``; nobody's or their lease run out,
# no child run) the oldest not locked by another claimer at this moment (SKIP LOCKED:
# concurrent workers each get another run instead of waiting on one another)
_CLAIM_NEXT = f"""
UPDATE runs SET owner = %(owner)s, lease_until = {_NOW} + %(lease)s,
    generation = generation + 1
WHERE run_id = (
    SELECT run_id FROM runs
    WHERE (status = ANY(%(statuses)s) OR (status = 'WAITING_APPROVAL'
           AND ((waiting::jsonb ->> 'deadline')::float8 <= {_NOW}
                OR waiting::jsonb -> 'running' IS NOT NULL)))
      AND (owner IS NULL OR lease_until IS NULL OR lease_until <= {_NOW})
      AND (%(any)s OR workflow = ANY(%(workflows)s))
      AND run_id <> ALL(%(exclude)s)
      AND options::jsonb -> 'parent' IS NULL
    ORDER BY created_at LIMIT 1
    FOR UPDATE SKIP LOCKED)
RETURNING run_id
"""

# told when a run may have become runnable (`claim_next`): a detached run created, a run
# released unfinished; workers LISTEN (`wait_runnable`) instead of only polling
RUNNABLE_CHANNEL = "interlock_runnable"

_TAKE_OVER = f"""
UPDATE runs SET owner = %(owner)s, lease_until = {_NOW} + %(lease)s,
    generation = generation + 1
WHERE run_id = %(run)s AND owner = %(gone)s
RETURNING generation
"""

# A lease renewed only for the claim that holds it now: the owner, and the generation
# when the caller names one (a superseded claim of the same owner must not extend the
# lease of the one that replaced it).
_HEARTBEAT = f"""
UPDATE runs SET lease_until = {_NOW} + %(lease)s
WHERE run_id = %(run)s AND owner = %(owner)s
  AND (%(gen)s::bigint IS NULL OR generation = %(gen)s::bigint)
RETURNING 1
"""
