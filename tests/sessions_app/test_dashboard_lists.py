"""The session list and "needs attention" at scale, the charts, and the dashboard's error
answers: positions and totals that agree with the rows, filters that validate the same
way, sections paged on their own, and errors that name the problem in the page's style."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from sessions_app.models import AgentSession, Status, Step
from sessions_app.selectors import core as selectors
from sessions_app.services.core import session_start

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


def make_sessions(n, **fields):
    now = timezone.now()
    AgentSession.objects.bulk_create(
        [
            AgentSession(
                agent=fields.get("agent", "demo"),
                title=f"{fields.get('title', 's')} {i}",
                status=fields.get("status", Status.COMPLETED),
                created_at=now - timedelta(minutes=i),
                updated_at=now - timedelta(seconds=i),
                **{k: v for k, v in fields.items() if k not in ("agent", "title", "status")},
            )
            for i in range(n)
        ]
    )


def position(body: str) -> str:
    """The pager's "51–100 of 120" (its total is there once the counts are)."""
    match = re.search(r'<span class="position">(.*?)</span></span>', body)
    return re.sub(r"<[^>]+>", "", match.group(1)).strip() if match else ""


def list_page(client, query=None):
    """The list as a person sees it: the page, after its counts came in."""
    client.get(reverse("sessions:counts"), query or {}, **HX)
    return client.get(reverse("sessions:list"), query or {})


def test_the_list_says_where_it_is_and_pages_both_ways(client, users):
    make_sessions(120)
    client.force_login(users["viewer"])
    # Counts not yet counted: the page does not wait for them; their fragment says.
    cold = client.get(reverse("sessions:list")).content.decode()
    assert position(cold) == "1–50" and "counting…" in cold
    counts = client.get(reverse("sessions:counts"), **HX).content.decode()
    assert '<span id="listed" hx-swap-oob="true">of 120</span>' in counts
    first = client.get(reverse("sessions:list"))
    assert position(first.content.decode()) == "1–50 of 120"
    assert first.context["prev_query"] is None
    second = client.get(reverse("sessions:list"), first.context["next_query"])
    assert position(second.content.decode()) == "51–100 of 120"
    third = client.get(reverse("sessions:list"), second.context["next_query"])
    assert position(third.content.decode()) == "101–120 of 120"
    assert third.context["next_query"] is None
    back = client.get(reverse("sessions:list"), third.context["prev_query"])
    assert [s.id for s in back.context["sessions"]] == [s.id for s in second.context["sessions"]]
    assert position(back.content.decode()) == "51–100 of 120"
    # A link that lost its position still says where it is (counted).
    query = dict(second.context["next_query"])
    query.pop("pos")
    assert position(client.get(reverse("sessions:list"), query).content.decode()) == (
        "101–120 of 120"
    )
    # Back from fewer than a page in: the first page, in full.
    two_in = client.get(
        reverse("sessions:list"),
        {"before": selectors.encode_cursor(first.context["sessions"][2], "-updated")},
    )
    assert [s.id for s in two_in.context["sessions"]] == [s.id for s in first.context["sessions"]]


def test_large_totals_are_approximate_and_searches_capped(client, users, monkeypatch):
    make_sessions(1200, title="bulk")
    client.force_login(users["viewer"])
    assert position(list_page(client).content.decode()) == "1–50 of about 1,200"
    monkeypatch.setattr(selectors, "SEARCH_COUNT_CAP", 100)
    body = list_page(client, {"q": "bulk"}).content.decode()
    assert position(body) == "1–50 of more than 100"
    assert "all <b>101+</b>" in body


def test_counts_follow_the_filters_and_agree_with_the_rows(client, users):
    make_sessions(7, agent="echo", status=Status.FAILED)
    make_sessions(5, agent="echo", status=Status.COMPLETED)
    make_sessions(30, agent="demo", status=Status.FAILED)
    client.force_login(users["viewer"])
    response = list_page(client, {"agent": "echo", "status": "failed"})
    counts = {value: n for value, _, n in response.context["counts"]}
    assert counts["failed"] == 7 and counts["completed"] == 5 and response.context["total"] == 12
    assert len(response.context["sessions"]) == 7
    assert position(response.content.decode()) == "1–7 of 7"
    body = response.content.decode()
    # The chips keep the other filters; the polled fragment asks with them too.
    assert 'href="/sessions/?agent=echo&amp;status=completed"' in body
    assert 'hx-get="/sessions/counts/?status=failed&amp;agent=echo"' in body
    fragment = client.get(reverse("sessions:counts"), {"agent": "echo"}, **HX).content.decode()
    assert "<html" not in fragment and 'data-status="failed">failed <b>7</b>' in fragment


def test_every_filter_is_checked_the_same_way(client, users):
    make_sessions(3, agent="echo")
    client.force_login(users["viewer"])
    response = client.get(
        reverse("sessions:list"),
        {
            "agent": "no-such-agent",
            "created_from": "2026-05-02",
            "created_to": "2026-05-01",
            "q": "x" * 300,
            "sort": "sideways",
        },
    )
    errors = response.context["filters"].errors
    assert "unknown agent 'no-such-agent'" in errors
    assert any("created: the first date (2026-05-02) is after the second" in e for e in errors)
    assert any("search: at most 200 characters" in e for e in errors)
    assert "unknown sort 'sideways'" in errors
    assert all(e in response.content.decode() for e in ["unknown agent", "is after the second"])
    # An agent no longer registered but with sessions is a fine filter.
    make_sessions(2, agent="retired-agent")
    ok = client.get(reverse("sessions:list"), {"agent": "retired-agent"})
    assert ok.context["filters"].errors == [] and len(ok.context["sessions"]) == 2


def test_the_list_fragments_for_htmx(client, users):
    make_sessions(3)
    client.force_login(users["viewer"])
    rows = client.get(reverse("sessions:list"), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="rows")
    body = rows.content.decode()
    assert body.strip().startswith("<tbody") and "<html" not in body and body.count("<tr") == 3


def test_a_live_row_has_its_own_target_and_settles(client, users):
    live = session_start(agent="slow", input="count to 3")
    client.force_login(users["operator"])
    body = client.get(reverse("sessions:list")).content.decode()
    row = re.search(rf'<tr id="row-{live.id}"[^>]*>', body).group(0)
    # Its refresh replaces the row itself, whatever the elements around it target.
    assert 'hx-target="this"' in row and 'hx-swap="outerHTML"' in row
    assert f'id="pick-{live.id}"' in body
    AgentSession.objects.filter(id=live.id).update(status=Status.COMPLETED)
    settled = client.get(reverse("sessions:row", args=[live.id]))
    assert settled.status_code == 286 and "sessions-settled" in settled["HX-Trigger-After-Swap"]
    assert f'id="pick-{live.id}"' in settled.content.decode()
    AgentSession.objects.filter(id=live.id).delete()
    gone = client.get(reverse("sessions:row", args=[live.id]))
    assert gone.status_code == 286 and "no longer exists" in gone.content.decode()


def test_a_bulk_cancel_tells_the_rows_and_counts_to_redraw(client, users):
    running = [session_start(agent="slow", input=f"count to {i + 3}") for i in range(2)]
    client.force_login(users["operator"])
    ids = [str(s.id) for s in running]
    preview = client.post(reverse("sessions:bulk"), {"action": "cancel", "ids": ids}, **HX)
    assert "This will cancel <b>2</b> sessions" in preview.content.decode()
    done = client.post(
        reverse("sessions:bulk"), {"action": "cancel", "ids": ids, "confirm": "yes"}, **HX
    )
    assert "2 done, 0 refused" in done.content.decode()
    assert "sessions-changed" in done["HX-Trigger-After-Swap"]
    assert set(AgentSession.objects.values_list("status", flat=True)) == {Status.CANCELLED}
    nothing = client.post(reverse("sessions:bulk"), {"action": "cancel", "ids": []}, **HX)
    assert nothing.status_code == 400
    assert 'data-error role="alert">select at least one session first' in nothing.content.decode()


def test_needs_attention_is_paged_per_section_with_capped_counts(client, users, monkeypatch):
    expired = timezone.now() - timedelta(minutes=5)
    make_sessions(
        45,
        agent="slow",
        status=Status.RUNNING,
        title="stuck",
        lease_owner="dead",
        lease_expires_at=expired,
    )
    make_sessions(3, agent="echo", status=Status.FAILED, title="boom", last_error="503 overloaded")
    make_sessions(2, agent="demo", status=Status.FAILED, title="bad", last_error="bad key")
    client.force_login(users["operator"])
    page = client.get(reverse("sessions:attention"))
    sections = {s.key: s for s in page.context["sections"]}
    stuck = sections["stuck"]
    assert stuck.count_label == "45" and len(stuck.rows) == 20 and stuck.next_cursor
    assert stuck.groups == [("slow", 45)]
    assert sections["failed"].groups == [("503 overloaded", 3), ("bad key", 2)]
    second = client.get(
        reverse("sessions:attention"), {"section": "stuck", "stuck": stuck.next_cursor}, **HX
    )
    body = second.content.decode()
    assert body.strip().startswith('<section class="attention-section') and "<html" not in body
    shown = set(re.findall(r'href="/sessions/([0-9a-f-]{36})/"', body))
    assert len(shown) == 20 and not shown & {str(s.id) for s in stuck.rows}
    monkeypatch.setattr(selectors, "ATTENTION_CAP", 30)
    capped = client.get(reverse("sessions:attention"))
    stuck = {s.key: s for s in capped.context["sections"]}["stuck"]
    assert stuck.count_label == "30+" and stuck.capped
    assert "Counted up to 30: there are more." in capped.content.decode()
    bad = client.get(reverse("sessions:attention"), {"stuck": "%%%"})
    assert "stuck: that page link is broken" in bad.content.decode()


def test_list_charts_count_sessions_and_step_latency(client, users):
    make_sessions(4, status=Status.COMPLETED)
    make_sessions(2, status=Status.FAILED)
    session = session_start(agent="echo", input="hi")
    now = timezone.now()
    Step.objects.create(
        session=session,
        seq=2,
        kind="model",
        payload={"content": [], "tool_calls": []},
        started_at=now - timedelta(milliseconds=300),
        finished_at=now,
    )
    client.force_login(users["viewer"])
    response = client.get(reverse("sessions:charts"), {"span": "24h"}, **HX)
    activity, latency = response.context["activity"], response.context["latency"]
    assert activity["totals"] == {"started": "7", "completed": "4", "failed": "2"}
    p50 = next(line for line in latency["lines"] if line["name"] == "model p50")
    assert p50["dots"] and p50["dots"][-1]["title"].endswith("model p50 300 ms")
    assert client.get(reverse("sessions:charts"), {"span": "1y"}, **HX).status_code == 400
    page = client.get(reverse("sessions:charts"))  # followed as a link: a whole page
    assert "<html" in page.content.decode() and 'id="charts"' in page.content.decode()


def test_errors_are_fragments_for_htmx_and_styled_pages_otherwise(client, users):
    session = session_start(agent="echo", input="hi")
    client.force_login(users["viewer"])
    refused = client.post(reverse("sessions:action", args=[session.id, "cancel"]), **HX)
    assert refused.status_code == 403
    assert refused.content.decode().strip() == (
        '<p class="error" data-error role="alert">Refused: only operators can change sessions</p>'
    )
    page = client.post(reverse("sessions:action", args=[session.id, "cancel"]))
    assert page.status_code == 403 and "respawn.css" in page.content.decode()
    missing = client.get("/sessions/00000000-0000-0000-0000-000000000000/", **HX)
    assert missing.status_code == 404 and "Not found: no such session" in missing.content.decode()
    lost = client.get("/no/such/page/")
    assert lost.status_code == 404 and "respawn.css" in lost.content.decode()


def test_an_expired_form_token_is_refused_in_the_dashboard_style(users):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(users["operator"])
    session = session_start(agent="echo", input="hi")
    response = strict.post(reverse("sessions:action", args=[session.id, "cancel"]), **HX)
    assert response.status_code == 403
    assert "security token is missing or expired" in response.content.decode()
    assert AgentSession.objects.get(id=session.id).status == Status.QUEUED
