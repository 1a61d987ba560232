"""The support desk's own data: its documents (shipped in docs/) and a tickets table.

The tickets table is a SQLite file of its own (`SUPPORT_DESK_DB`, default
`var/support-desk.sqlite3` under the working directory), standing for whatever system a team's
tools really write to. Writes carry the tool call's idempotency key in a UNIQUE column, so
a call run again after a crash finds its row instead of writing a second one.
"""

from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent / "docs"


@dataclass(frozen=True)
class Doc:
    id: str
    title: str
    text: str


def documents() -> list[Doc]:
    docs = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        title = text.splitlines()[0].lstrip("# ").strip()
        docs.append(Doc(id=path.stem, title=title, text=text))
    return docs


def search(query: str, limit: int = 3) -> list[tuple[Doc, int]]:
    """Documents ranked by how many of the query's words they contain."""
    words = {w for w in re.findall(r"[a-z0-9]+", query.lower()) if len(w) > 2}
    ranked = []
    for doc in documents():
        text = doc.text.lower()
        score = sum(text.count(w) for w in words)
        if score:
            ranked.append((doc, score))
    ranked.sort(key=lambda pair: (-pair[1], pair[0].id))
    return ranked[:limit]


def _connect() -> sqlite3.Connection:
    path = Path(os.environ.get("SUPPORT_DESK_DB") or Path.cwd() / "var" / "support-desk.sqlite3")
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=30)
    db.execute(
        "CREATE TABLE IF NOT EXISTS tickets (id INTEGER PRIMARY KEY, key TEXT UNIQUE NOT NULL,"
        " session TEXT NOT NULL, subject TEXT NOT NULL, body TEXT NOT NULL,"
        " priority TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'open')"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS refunds (id INTEGER PRIMARY KEY, key TEXT UNIQUE NOT NULL,"
        " order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL, reason TEXT NOT NULL)"
    )
    return db


def open_ticket(key: str, *, session: str, subject: str, body: str, priority: str) -> int:
    """The ticket written under `key` (written now, or found from an earlier run)."""
    with _connect() as db:
        db.execute(
            "INSERT OR IGNORE INTO tickets (key, session, subject, body, priority)"
            " VALUES (?, ?, ?, ?, ?)",
            (key, session, subject, body, priority),
        )
        return db.execute("SELECT id FROM tickets WHERE key = ?", (key,)).fetchone()[0]


def ticket(ticket_id: int) -> dict | None:
    with _connect() as db:
        row = db.execute(
            "SELECT id, subject, priority, status FROM tickets WHERE id = ?", (ticket_id,)
        ).fetchone()
    return (
        None
        if row is None
        else dict(zip(("id", "subject", "priority", "status"), row, strict=True))
    )


def refund(key: str, *, order_id: str, amount_cents: int, reason: str) -> int:
    with _connect() as db:
        db.execute(
            "INSERT OR IGNORE INTO refunds (key, order_id, amount_cents, reason)"
            " VALUES (?, ?, ?, ?)",
            (key, order_id, amount_cents, reason),
        )
        return db.execute("SELECT id FROM refunds WHERE key = ?", (key,)).fetchone()[0]


def refunds_of(order_id: str) -> int:
    with _connect() as db:
        return db.execute(
            "SELECT count(*) FROM refunds WHERE order_id = ?", (order_id,)
        ).fetchone()[0]
