"""How durations read wherever a person sees one (the pages, the API's titles, the attention
list's headings): text only, no models, so every layer may import it."""

from __future__ import annotations

from datetime import timedelta


def format_ms(ms: float | None) -> str:
    """A duration in milliseconds as "0.4 ms", "223 ms", "1.4 s", "1 m 12 s", "3 h 5 m"."""
    if ms is None:
        return ""
    if ms < 0:
        ms = 0.0
    if ms < 1:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} m {secs} s" if secs else f"{minutes} m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} m" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def format_duration(value: timedelta | float | None) -> str:
    """A timedelta (or seconds) as format_ms does."""
    if value is None:
        return ""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    return format_ms(seconds * 1000)
