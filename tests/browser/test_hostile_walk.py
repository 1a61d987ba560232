"""Every page an operator opens, walked with hostile and large data: titles, agent names,
inputs and tool calls in every Unicode class (right-to-left, combining marks, emoji
sequences, zero-width characters, CJK, markup, template syntax, 300 characters without a
space), a 10,000-step session and 100,000 sessions, at a phone's 390 px and at 1,400 px.
A page fails the walk on a 5xx, on anything the console reports, or on a horizontal
scroll."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from agent_runtime.state import model_payload, user_payload
from sessions_app.models import AgentSession, Checkpoint, Status, Step

from ..builders import build_long_session
from .conftest import console_errors, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HOSTILE = [
    "W" * 300,
    "\u202eRTL override\u202c مرحبا بالعالم שלום עולם",
    "e\u0301\u0301\u0301 a\u0308\u0308 combining marks",
    "👩\u200d👩\u200d👧\u200d👦 🏳\ufe0f\u200d🌈 emoji sequences",
    "zero\u200bwidth\u200djoiner\ufeffbom\u2060",
    "<script>alert(1)</script><img src=x onerror=alert(2)>",
    "日本語のとても長いセッションのタイトル" * 12,
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 ﷽",
    "tab\there \"quotes\" 'single' `back` {{ template }} {% tag %} ${x}",
    "https://example.invalid/" + "very/long/path/" * 25,
]
SESSIONS = 100_000
WIDTHS = (390, 1400)


def _many_sessions(template: AgentSession, count: int) -> None:
    """`count` copies of a session row in one INSERT ... SELECT: titles, agents and
    statuses cycle through the hostile values."""
    table = AgentSession._meta.db_table
    columns = [f.column for f in AgentSession._meta.concrete_fields if f.column != "id"]
    varying = {"title", "agent", "status", "created_at", "updated_at"}
    kept = [c for c in columns if c not in varying]
    titles = "ARRAY[" + ", ".join(["%s"] * len(HOSTILE)) + "]"
    statuses = [Status.COMPLETED, Status.FAILED, Status.PAUSED, Status.CANCELLED]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (id, title, agent, status, created_at, updated_at,"
            f" {', '.join(kept)})"
            f" SELECT gen_random_uuid(), ({titles})[1 + g %% {len(HOSTILE)}],"
            f" CASE WHEN g %% 3 = 0 THEN %s ELSE t.agent END,"
            f" (ARRAY[{', '.join(['%s'] * len(statuses))}])[1 + g %% {len(statuses)}],"
            " t.created_at - g * interval '1 second', t.updated_at - g * interval '1 second',"
            f" {', '.join('t.' + c for c in kept)}"
            f" FROM {table} t, generate_series(1, %s) g WHERE t.id = %s",
            [*(h[:300] for h in HOSTILE), "agent-" + "x" * 90, *statuses, count, template.id],
        )


@pytest.fixture
def hostile(db):
    now = timezone.now()
    session = AgentSession.objects.create(
        agent="demo", title=HOSTILE[0], status=Status.PAUSED, created_at=now, updated_at=now
    )
    steps = [Step(session=session, seq=1, kind="user", payload=user_payload(" | ".join(HOSTILE)))]
    for n, text in enumerate(HOSTILE, start=2):
        call = {"id": f"c{n}", "name": "t" * 60, "arguments": {text: text, "list": [text] * 3}}
        steps.append(
            Step(session=session, seq=n, kind="model", payload=model_payload(text, [call], {}, "m"))
        )
    Step.objects.bulk_create(steps)
    state = {
        "schema_version": 3,
        "agent": {"name": "demo", "version": "1"},
        "plan": [{"id": "p1", "title": HOSTILE[6], "status": "in_progress"}],
        "memory_refs": [HOSTILE[1]],
    }
    for seq in (1, len(steps)):
        Checkpoint.objects.create(session=session, seq=seq, state=state, reason="auto")
    AgentSession.objects.filter(id=session.id).update(
        last_seq=len(steps), step_count=len(steps), head=len(steps), last_error=HOSTILE[5]
    )
    long = build_long_session(10_000, title=HOSTILE[6], status=Status.FAILED).session
    _many_sessions(session, SESSIONS)
    return session, long


def _walk(page, path: str, name: str) -> list[str]:
    """Open a page; what is wrong with it."""
    page.console_errors.clear()
    response = page.goto(path)
    page.wait_for_load_state("networkidle")
    problems = []
    if response is None or response.status >= 500:
        problems.append(f"{path}: answered {response.status if response else 'nothing'}")
    problems += [f"{path}: console: {e}" for e in console_errors(page)]
    overflow = page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    if overflow > 1:
        wide = page.evaluate(
            """() => {
                const out = e => e.getBoundingClientRect().right > innerWidth + 1;
                // The innermost elements that stick out: the ones to fix.
                return [...document.querySelectorAll('body *')]
                    .filter(e => out(e) && ![...e.children].some(out))
                    .slice(0, 4)
                    .map(e => e.tagName + '.' + e.className + ' ' + e.outerHTML.slice(0, 80));
            }"""
        )
        problems.append(f"{path}: scrolls sideways by {overflow}px ({wide})")
    screenshot(page, name, full_page=False)
    return problems


def test_every_page_with_hostile_and_large_data_at_390_and_1400_px(make_page, users, hostile):
    session, long = hostile
    assert AgentSession.objects.count() == SESSIONS + 2
    checkpoints = list(Checkpoint.objects.filter(session=session).values_list("id", flat=True))
    pages = [
        "/sessions/",
        "/sessions/?q=" + "日本語",
        "/sessions/?status=failed&agent=" + "agent-" + "x" * 90,
        "/sessions/?page=200",
        "/sessions/attention/",
        "/sessions/agents/",
        "/sessions/costs/",
        "/sessions/import/",
        f"/sessions/{session.id}/",
        f"/sessions/{session.id}/diff/?a={checkpoints[0]}&b={checkpoints[-1]}",
        f"/sessions/{long.id}/",
        f"/sessions/{long.id}/?from=latest",
        "/sessions/new/",
        "/sessions/new/?agent=" + "x" * 300,
        "/audit/",
    ]
    problems = []
    for width in WIDTHS:
        page = make_page(width, 900)
        login(page, "olivia", "pw-operator")
        for index, path in enumerate(pages):
            problems += _walk(page, path, f"hostile-walk-{width}-{index}")
    assert not problems, "\n".join(problems)
