"""Full-text search over the messages of conversations (``recall: true``): what
every store shares. SQLite answers with an FTS5 table (`_sqlite_search`), PostgreSQL with
its full-text search (`_postgres_search`); both keep their index beside the log, filled
from the ``chat.message`` and ``chat.reply`` records of a workflow's runs when it is
searched (what was appended since the last search, per run). Other stores (memory://)
scan the records (`scan`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from .._log import Entry


class Store(Protocol):  # (what `scan` reads of a `_base.Store`)
    async def list_runs(self, *, status: str | None = None, workflow: str | None = None,
                        limit: int = 100) -> list[Any]: ...

    async def entries(self, run_id: str, after: int = 0) -> list[Entry]: ...

CHAT_TYPES = ("chat.message", "chat.reply")
MAX_WORDS = 32
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True, slots=True)
class Found:
    """A message found: its run, its record's seq, ``message`` (the user's) or ``reply``
    (the agent's), its text."""

    run_id: str
    seq: int
    kind: str
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "seq": self.seq, "kind": self.kind, "text": self.text}


def words(query: str) -> list[str]:
    """The query's words (letters and digits; no operator of any engine's syntax)."""
    return [w.lower() for w in _WORD.findall(query)][:MAX_WORDS]


def kind_of(rtype: str) -> str:
    return "message" if rtype == "chat.message" else "reply"


def text_of(rec: dict[str, Any]) -> str | None:
    value = rec.get("text") if rec.get("type") == "chat.message" else rec.get("reply")
    return value if isinstance(value, str) else None


async def scan(store: Store, workflow: str, query: str, limit: int,
               exclude: str | None) -> list[Found]:
    """The search of a store without an index: every message of the workflow's runs,
    ranked by how many of the query's words it has."""
    wanted = set(words(query))
    if not wanted:
        return []
    scored: list[tuple[int, float, Found]] = []
    for row in await store.list_runs(workflow=workflow, limit=10_000):
        if row.run_id == exclude:
            continue
        for entry in await store.entries(row.run_id):
            rec = entry.record()
            if rec.get("type") not in CHAT_TYPES:
                continue
            text = text_of(rec)
            if text is None:
                continue
            hits = len(wanted & set(words(text)))
            if hits:
                scored.append((hits, -row.created_at, Found(
                    row.run_id, entry.seq, kind_of(rec["type"]), text)))
    scored.sort(key=lambda t: (-t[0], t[1], t[2].seq))
    return [f for _, _, f in scored[:limit]]
