"""The research demo agent's local corpus: short plain-text notes, one topic per file."""

from __future__ import annotations

import functools
import re
from pathlib import Path

DIR = Path(__file__).resolve().parent


@functools.cache
def sources() -> tuple[str, ...]:
    """Every source name (a file's stem), sorted."""
    return tuple(sorted(p.stem for p in DIR.glob("*.txt")))


def lines(source: str) -> list[str]:
    if source not in sources():
        raise KeyError(source)
    return (DIR / f"{source}.txt").read_text(encoding="utf-8").splitlines()


def search(source: str, query: str) -> list[str]:
    """The lines of a source that contain any word of the query (case-insensitive)."""
    words = [w for w in re.findall(r"\w+", query.lower()) if len(w) > 2]
    stems = [w[:-1] if w.endswith("s") and len(w) > 3 else w for w in words]
    return [line for line in lines(source) if any(stem in line.lower() for stem in stems)]


def pick(topic: str, n: int) -> list[str]:
    """N sources for a topic: those whose name or text mention it first, then the rest."""

    def score(source: str) -> tuple[int, str]:
        return (0 if search(source, topic) else 1, source)

    return sorted(sources(), key=score)[:n]
