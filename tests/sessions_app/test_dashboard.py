"""Dashboard views: every page, fragment and action; who may do what; query bounds."""

from __future__ import annotations

import pytest
from django.urls import reverse

from sessions_app.models import AgentSession, AuditEvent, Checkpoint, Status, Step
from sessions_app.services.core import session_add_instruction, session_start
from sessions_app.store import session_store

from ..conftest import run_inline

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def done(db):
    return run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it as a note"))


@pytest.fixture
def waiting(db):
    return run_inline(session_start(agent="approval", input="pay invoice 12"))


def read_urls(session):
    return [
        reverse("sessions:list"),
        reverse("sessions:counts"),
        reverse("sessions:attention"),
        reverse("audit"),
        reverse("sessions:detail", args=[session.id]),
        reverse("sessions:panel", args=[session.id]) + "?part=header",
        reverse("sessions:row", args=[session.id]),
        reverse("sessions:steps", args=[session.id]) + "?after=0",
        reverse("sessions:timeline", args=[session.id]),
        reverse("sessions:usage", args=[session.id]),
        reverse("sessions:charts"),
        reverse("sessions:diff", args=[session.id]),
    ]


# Every action of the dashboard, for every role: test_dashboard_actions.py (read from the
# actions table).


def test_anonymous_is_sent_to_login_everywhere(client, done):
    for url in read_urls(done):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login")), url


def test_viewer_reads_every_page_and_sees_no_action_buttons(client, users, done):
    client.force_login(users["viewer"])
    for url in read_urls(done):
        response = client.get(url)
        assert response.status_code in (200, 286), url
    page = client.get(reverse("sessions:detail", args=[done.id])).content.decode()
    assert "Resume…" not in page and "roll back here" not in page and "Send message" not in page
    assert "fork from here" not in page
    # The actions card says why it holds nothing rather than standing empty.
    assert "Read only: your role can look at sessions, not change them." in page
    client.force_login(users["operator"])
    page = client.get(reverse("sessions:detail", args=[done.id])).content.decode()
    assert "Read only" not in page and "fork from here" in page


def test_outsider_is_refused_everywhere(client, users, done):
    client.force_login(users["outsider"])
    for url in read_urls(done):
        assert client.get(url).status_code == 403, url


def test_actions_are_post_only(client, users, done):
    client.force_login(users["operator"])
    assert client.get(reverse("sessions:action", args=[done.id, "cancel"])).status_code == 405
    assert client.get(reverse("sessions:bulk")).status_code == 405


def test_operator_sees_buttons(client, users, done):
    client.force_login(users["operator"])
    page = client.get(reverse("sessions:detail", args=[done.id])).content.decode()
    assert "roll back here" in page and "fork from here" in page and "Send message" in page


def test_rollback_action_supersedes_and_is_audited(client, users, done):
    client.force_login(users["operator"])
    response = client.post(
        reverse("sessions:action", args=[done.id, "rollback"]), {"checkpoint_seq": 7}, **HX
    )
    assert response.status_code == 200
    assert "Rolled back to checkpoint 7" in response.content.decode()
    assert "trace-changed" in response.headers["HX-Trigger-After-Swap"]
    done.refresh_from_db()
    assert done.status == Status.PAUSED and done.head == 7
    assert Step.objects.filter(session=done, superseded_at__isnull=False).count() == 6
    event = AuditEvent.objects.get(session=done, action="rollback")
    assert event.actor == users["operator"] and event.request_meta["via"] == "dashboard"


def test_cannot_roll_back_a_running_session(client, users):
    session = session_start(agent="slow", input="count to 3")
    session_store().claim(str(session.id), "w", ttl=60)
    client.force_login(users["operator"])
    response = client.post(
        reverse("sessions:action", args=[session.id, "rollback"]), {"checkpoint_seq": 1}, **HX
    )
    assert response.status_code == 409
    assert "cannot roll back a running session" in response.content.decode()
    assert not AuditEvent.objects.filter(action="rollback").exists()


def test_action_without_htmx_redirects_with_a_message(client, users, done):
    client.force_login(users["operator"])
    response = client.post(reverse("sessions:action", args=[done.id, "resume"]), follow=True)
    assert response.redirect_chain[-1][0] == reverse("sessions:detail", args=[done.id])
    assert "cannot be resumed" in response.content.decode()


def test_fork_goes_to_the_new_session(client, users, done):
    client.force_login(users["operator"])
    response = client.post(
        reverse("sessions:action", args=[done.id, "fork"]), {"checkpoint_seq": 7}, **HX
    )
    fork = AgentSession.objects.get(parent=done)
    assert response.headers["HX-Redirect"] == reverse("sessions:detail", args=[fork.id])
    assert fork.status == Status.PAUSED and fork.step_count == 7


def test_approve_and_reject(client, users, waiting):
    client.force_login(users["operator"])
    page = client.get(reverse("sessions:detail", args=[waiting.id])).content.decode()
    assert "Waiting for approval" in page and "send_payment" in page
    # The arguments as the tool gets them: JSON, not a Python dict.
    assert "&quot;amount_cents&quot;: " in page and "&#x27;amount_cents&#x27;" not in page
    response = client.post(
        reverse("sessions:action", args=[waiting.id, "approve"]), {"reason": "ok"}, **HX
    )
    assert response.status_code == 200 and "Approved" in response.content.decode()
    waiting.refresh_from_db()
    assert waiting.status == Status.QUEUED
    response = client.post(reverse("sessions:action", args=[waiting.id, "reject"]), **HX)
    assert response.status_code == 409 and "nothing is waiting" in response.content.decode()


def test_message_instruction_and_correction(client, users, done):
    client.force_login(users["operator"])
    url = reverse("sessions:action", args=[done.id, "correct"])
    calc = Step.objects.get(session=done, kind="tool_result", payload__name="calculator")
    response = client.post(url, {"result_seq": calc.seq, "output": "{not json"}, **HX)
    assert response.status_code == 400 and "not valid JSON" in response.content.decode()
    assert done.steps.count() == 13
    response = client.post(
        url, {"result_seq": calc.seq, "output": '{"value": 88}', "note": "off by one"}, **HX
    )
    assert response.status_code == 200
    correction = done.steps.order_by("-seq").first()
    assert correction.kind == "operator"
    assert correction.payload["action"] == "correct_result" and correction.payload["output"] == {
        "value": 88
    }
    assert correction.payload["actor"] == "olivia"
    run_inline(done)
    assert done.status == Status.COMPLETED
    # The original stays in the trace.
    assert Step.objects.get(pk=calc.pk).payload["output"]["value"] == 87

    response = client.post(
        reverse("sessions:action", args=[done.id, "instruct"]), {"text": "   "}, **HX
    )
    assert response.status_code == 400 and "must not be empty" in response.content.decode()
    response = client.post(
        reverse("sessions:action", args=[done.id, "message"]), {"content": "what is 2+2"}, **HX
    )
    assert response.status_code == 200
    assert run_inline(done).final_answer == "2+2 = 4."


def test_preview_of_rollback_lists_superseded_steps_and_tool_calls(client, users, done):
    client.force_login(users["operator"])
    page = client.get(
        reverse("sessions:preview", args=[done.id, "rollback"]) + "?seq=7"
    ).content.decode()
    assert "<b>6</b> steps will be marked superseded" in page
    assert "save_note" in page and "Confirm rollback" in page


def test_preview_of_resume_names_the_call_that_runs_again(client, users):
    session = session_start(agent="slow", input="count to 2")
    store = session_store()
    lease = store.claim(str(session.id), "w", ttl=0.01)
    from agent_runtime.state import NewStep, StepKind

    store.append(
        lease,
        [
            NewStep(
                kind=StepKind.MODEL,
                payload={
                    "content": [{"type": "text", "text": "t"}],
                    "tool_calls": [{"id": "c1", "name": "tick", "arguments": {"n": 1}}],
                },
            ),
            NewStep(
                kind=StepKind.TOOL_CALL,
                payload={"call_id": "c1", "name": "tick", "arguments": {"n": 1}},
            ),
        ],
    )
    client.force_login(users["operator"])
    page = client.get(reverse("sessions:preview", args=[session.id, "resume"])).content.decode()
    assert "Tool call #3 (tick) was recorded but has no result: it runs again" in page

    # Then a person adds an instruction: the worker answers it (the engine's next_action
    # reads new input after the model's turn first), and the preview says the same.
    store.release(lease)
    AgentSession.objects.filter(id=session.id).update(status=Status.PAUSED)
    session_add_instruction(session_id=session.id, text="stop counting", actor=users["operator"])
    AgentSession.objects.filter(id=session.id).update(status=Status.PAUSED)
    page = client.get(reverse("sessions:preview", args=[session.id, "resume"])).content.decode()
    assert "The model is called next" in page
    assert "was recorded but has no result" not in page


def test_bulk_resume_counts_first_then_reports_per_session(client, users):
    client.force_login(users["operator"])
    failed = [session_start(agent="echo", input=f"hi {i}") for i in range(3)]
    AgentSession.objects.filter(id__in=[s.id for s in failed]).update(status=Status.FAILED)
    completed = run_inline(session_start(agent="echo", input="done"))
    ids = [str(s.id) for s in failed] + [str(completed.id)]
    preview = client.post(
        reverse("sessions:bulk"), {"action": "resume", "ids": ids}, **HX
    ).content.decode()
    assert "This will resume <b>4</b> sessions" in preview
    assert AgentSession.objects.filter(status=Status.QUEUED).count() == 0
    report = client.post(
        reverse("sessions:bulk"), {"action": "resume", "ids": ids, "confirm": "yes"}, **HX
    )
    text = report.content.decode()
    assert "3 done, 1 refused" in text and "cannot be resumed" in text
    assert AgentSession.objects.filter(status=Status.QUEUED).count() == 3


def test_bulk_rejects_bad_ids(client, users):
    client.force_login(users["operator"])
    response = client.post(reverse("sessions:bulk"), {"action": "resume", "ids": ["nope"]})
    assert response.status_code == 400 and "not a session id" in response.content.decode()
    response = client.post(reverse("sessions:bulk"), {"action": "explode", "ids": []})
    assert response.status_code == 400


def test_list_filters_search_and_keyset_pages(client, users):
    client.force_login(users["viewer"])
    for i in range(60):
        AgentSession.objects.create(agent="echo" if i % 2 else "demo", title=f"session {i}")
    needle = session_start(agent="demo", input="find the quokka please")
    first = client.get(reverse("sessions:list"))
    assert first.status_code == 200
    body = first.content.decode()
    assert "next page" in body and "cursor=" in body
    cursor = first.context["next_query"]["cursor"]
    second = client.get(reverse("sessions:list"), {"cursor": cursor})
    ids_first = {s.id for s in first.context["sessions"]}
    ids_second = {s.id for s in second.context["sessions"]}
    assert len(ids_first) == 50 and len(ids_second) == 11 and not ids_first & ids_second
    found = client.get(reverse("sessions:list"), {"q": "quokka"}).context["sessions"]
    assert [s.id for s in found] == [needle.id]
    assert [
        s.id
        for s in client.get(reverse("sessions:list"), {"q": str(needle.id)}).context["sessions"]
    ] == [needle.id]
    echo = client.get(reverse("sessions:list"), {"agent": "echo"}).context["sessions"]
    assert echo and all(s.agent == "echo" for s in echo)
    bad = client.get(
        reverse("sessions:list"), {"status": "bogus", "created_from": "yesterday", "cursor": "%%"}
    )
    text = bad.content.decode()
    assert "unknown status" in text and "not a date" in text and "bad cursor" in text


def test_list_fragment_for_htmx(client, users, done):
    client.force_login(users["viewer"])
    response = client.get(
        reverse("sessions:list"), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="results"
    )
    assert response.status_code == 200
    assert "<html" not in response.content.decode() and 'id="results"' in response.content.decode()


def test_row_and_panel_stop_polling_once_final(client, users, done):
    client.force_login(users["viewer"])
    assert client.get(reverse("sessions:row", args=[done.id])).status_code == 286
    header = client.get(reverse("sessions:panel", args=[done.id]) + "?part=header")
    assert (
        header.status_code == 286 and "session-settled" in header.headers["HX-Trigger-After-Swap"]
    )
    live = session_start(agent="slow", input="count to 3")
    assert client.get(reverse("sessions:row", args=[live.id])).status_code == 200
    assert client.get(reverse("sessions:panel", args=[live.id]) + "?part=header").status_code == 200


def test_trace_pages_and_live_tail(client, users, done):
    client.force_login(users["viewer"])
    import re

    response = client.get(reverse("sessions:steps", args=[done.id]) + "?after=5")
    seqs = [int(s) for s in re.findall(r'data-seq="(\d+)"', response.content.decode())]
    assert seqs == list(range(6, 14))
    # Caught up with a finished session: stop polling.
    assert client.get(reverse("sessions:steps", args=[done.id]) + "?after=13").status_code == 286
    assert client.get(reverse("sessions:steps", args=[done.id]) + "?after=x").status_code == 400
    live = session_start(agent="slow", input="count to 3")
    tail = client.get(reverse("sessions:steps", args=[live.id]) + "?after=1")
    assert tail.status_code == 200 and 'class="live"' in tail.content.decode()


def test_long_trace_is_paged_and_superseded_steps_hidden(client, users, done):
    from sessions_app.services.core import checkpoint_rollback

    checkpoint_rollback(session_id=done.id, checkpoint_seq=7)
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:detail", args=[done.id]))
    shown = [v.seq for v in page.context["trace"].views]
    assert 8 not in shown and 14 in shown
    assert "show superseded steps (6)" in page.content.decode()
    with_superseded = client.get(reverse("sessions:detail", args=[done.id]), {"superseded": "1"})
    assert 8 in [v.seq for v in with_superseded.context["trace"].views]


def test_checkpoint_diff(client, users, done):
    client.force_login(users["viewer"])
    first, last = Checkpoint.objects.filter(session=done).order_by("seq")[::2]
    response = client.get(reverse("sessions:diff", args=[done.id]), {"a": first.pk, "b": last.pk})
    paths = {line.path for line in response.context["lines"]}
    assert "final_answer" in paths and "counters.model.calls" in paths
    assert "plan[0].status" in paths
    assert client.get(reverse("sessions:diff", args=[done.id]), {"a": "nope"}).status_code == 400


def test_audit_log_filters(client, users, done, waiting):
    from sessions_app.services.core import session_approve

    session_approve(session_id=waiting.id, actor=users["operator"])
    client.force_login(users["viewer"])
    all_events = client.get(reverse("audit")).context["events"]
    assert {e.action for e in all_events} >= {"start", "approve"}
    approves = client.get(reverse("audit"), {"action": "approve"}).context["events"]
    assert [e.session_id for e in approves] == [waiting.id]
    by_actor = client.get(reverse("audit"), {"actor": "olivia"}).context["events"]
    assert [e.action for e in by_actor] == ["approve"]
    assert "not a session id" in client.get(reverse("audit"), {"session": "x"}).content.decode()


def test_attention_lists_stuck_overdue_and_repeated_failures(client, users, settings):
    from datetime import timedelta

    from django.utils import timezone

    settings.RESPAWN_APPROVAL_SLA = 60
    stuck = session_start(agent="slow", input="count to 2")
    AgentSession.objects.filter(id=stuck.id).update(
        status=Status.RUNNING,
        lease_owner="dead",
        lease_expires_at=timezone.now() - timedelta(minutes=1),
    )
    waiting = run_inline(session_start(agent="approval", input="pay"))
    AgentSession.objects.filter(id=waiting.id).update(
        updated_at=timezone.now() - timedelta(hours=2)
    )
    failing = session_start(agent="echo", input="x")
    for seq in (2, 3):
        Step.objects.create(
            session=failing,
            seq=seq,
            kind="error",
            payload={"where": "model", "error": "503 overloaded"},
        )
    AgentSession.objects.filter(id=failing.id).update(status=Status.FAILED)
    client.force_login(users["operator"])
    response = client.get(reverse("sessions:attention"))
    assert [s.id for s in response.context["stuck"]] == [stuck.id]
    assert [s.id for s in response.context["approvals"]] == [waiting.id]
    assert [(f.session.id, f.times) for f in response.context["failures"]] == [(failing.id, 2)]
    assert "Dispatch again" in response.content.decode()


@pytest.mark.parametrize("rows", [5, 40])
def test_list_query_count_does_not_grow_with_rows(
    client, users, django_assert_max_num_queries, rows
):
    for i in range(rows):
        AgentSession.objects.create(agent="demo", title=f"s{i}")
    client.force_login(users["operator"])
    with django_assert_max_num_queries(6):
        assert client.get(reverse("sessions:list")).status_code == 200


@pytest.mark.parametrize("turns", [2, 12])
def test_detail_query_count_does_not_grow_with_steps(
    client, users, django_assert_max_num_queries, turns
):
    session = run_inline(session_start(agent="slow", input=f"count to {turns}"))
    client.force_login(users["operator"])
    with django_assert_max_num_queries(14):
        assert client.get(reverse("sessions:detail", args=[session.id])).status_code == 200
    with django_assert_max_num_queries(6):
        assert client.get(
            reverse("sessions:steps", args=[session.id]) + "?after=0"
        ).status_code in (200, 286)


XSS_PAYLOADS = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    '<a href="javascript:alert(1)">x</a>',
    "<svg onload=alert(1)></svg>",
    "[click me](javascript:alert(1))",
    '<div hx-get="/sessions/bulk/" hx-trigger="load">x</div>',
    '"><script>alert(1)</script>',
]


def test_untrusted_content_is_escaped_everywhere(client, users):
    """Every payload, in user input, model output, tool arguments and tool results, shows
    as text on every page that shows it: never as markup."""
    from agent_runtime.state import SCHEMA_VERSION

    p = XSS_PAYLOADS
    session = session_start(agent="demo", input=p[0] + p[5], title=p[1])
    steps = [
        (
            "model",
            {
                "content": [{"type": "text", "text": p[3] + p[4]}],
                "tool_calls": [
                    {"id": "c1", "name": "calculator", "arguments": {"expression": p[6]}}
                ],
                "usage": {},
                "model": "scripted:demo",
            },
        ),
        (
            "tool_call",
            {"call_id": "c1", "name": "calculator", "arguments": {"expression": p[1] + p[2]}},
        ),
        (
            "tool_result",
            {
                "call_id": "c1",
                "name": p[2],
                "status": "error",
                "error": p[1],
                "output": {"html": p[0] + p[5]},
            },
        ),
        ("error", {"where": "model", "error": p[3]}),
    ]
    for seq, (kind, payload) in enumerate(steps, start=2):
        Step.objects.create(
            session=session, seq=seq, kind=kind, payload=payload, schema_version=SCHEMA_VERSION
        )
    Checkpoint.objects.create(
        session=session,
        seq=5,
        state={
            "schema_version": SCHEMA_VERSION,
            "plan": [{"id": "p1", "title": p[1], "status": "pending"}],
        },
        reason="auto",
    )
    AgentSession.objects.filter(id=session.id).update(
        last_seq=5, head=5, final_answer=p[2] + p[4], last_error=p[0], status=Status.FAILED
    )
    client.force_login(users["operator"])
    for url in [
        reverse("sessions:list"),
        reverse("sessions:list") + "?q=alert",
        reverse("sessions:detail", args=[session.id]),
        reverse("sessions:steps", args=[session.id]) + "?after=0",
        reverse("sessions:diff", args=[session.id]),
        reverse("sessions:timeline", args=[session.id]),
        reverse("sessions:usage", args=[session.id]),
        reverse("sessions:preview", args=[session.id, "rollback"]) + "?seq=5",
        reverse("sessions:attention"),
        reverse("audit"),
    ]:
        body = client.get(url).content.decode()
        for payload in p:
            if payload.startswith("[click"):
                continue  # plain text: harmless unless rendered as markdown, which nothing does
            assert payload not in body, (url, payload)
        import re

        assert not re.search(
            r"<script>alert|<(img|svg|a|div)\b[^>]*(onerror|onload|javascript:|/sessions/bulk)",
            body,
        ), url


def test_attention_lists_incompatible_and_old_schema_sessions(client, users):
    from django.utils import timezone

    from agent_runtime.state import SCHEMA_VERSION

    broken = run_inline(session_start(agent="approval", input="pay"))
    AgentSession.objects.filter(id=broken.id).update(
        status=Status.PAUSED,
        incompatible_reason="checkpoint at seq 4: written by schema version 99",
        incompatible_at=timezone.now(),
        incompatible_code_schema=SCHEMA_VERSION,
    )
    old = run_inline(session_start(agent="approval", input="pay again"))
    Checkpoint.objects.filter(session=old, seq=old.head).update(schema_version=SCHEMA_VERSION - 1)
    client.force_login(users["operator"])
    response = client.get(reverse("sessions:attention"))
    assert [s.id for s in response.context["incompatible"]] == [broken.id]
    body = response.content.decode()
    assert "written by schema version 99" in body and "Try again" in body
    assert response.context["old_schema"] == (1, False)
    assert "upgrade_state" in body


def test_attention_offers_no_retry_the_resume_would_refuse(client, users):
    """An incompatible session waiting for a decision is not resumed (the model's
    resume_refusal): the page links to it, where the decision is taken."""
    from django.utils import timezone

    waiting = run_inline(session_start(agent="approval", input="pay"))
    assert waiting.status == Status.WAITING_INPUT
    AgentSession.objects.filter(id=waiting.id).update(
        incompatible_reason="checkpoint at seq 4: written by schema version 99",
        incompatible_at=timezone.now(),
    )
    client.force_login(users["operator"])
    body = client.get(reverse("sessions:attention")).content.decode()
    assert "written by schema version 99" in body and "Try again" not in body
    assert reverse("sessions:detail", args=[waiting.id]) in body
    refused = client.post(
        reverse("sessions:action", args=[waiting.id, "resume"]), HTTP_HX_REQUEST="true"
    )
    assert refused.status_code == 409


def _uncertain_notify_session():
    """A notify session whose worker died inside the (non-idempotent) tool, then resumed."""
    from agent_runtime.state import NewStep, StepKind

    session = session_start(agent="notify", input="deploy finished")
    store = session_store()
    lease = store.claim(str(session.id), "dead", ttl=0.01)
    store.append(
        lease,
        [
            NewStep(kind=StepKind.SYSTEM, payload={"event": "run_started"}),
            NewStep(
                kind=StepKind.MODEL,
                payload={
                    "content": [{"type": "text", "text": "Sending."}],
                    "tool_calls": [
                        {
                            "id": "call_0_0",
                            "name": "send_notification",
                            "arguments": {"to": "ops", "text": "x"},
                        }
                    ],
                    "usage": {},
                    "model": "scripted:notify",
                },
            ),
            NewStep(
                kind=StepKind.TOOL_CALL,
                payload={
                    "call_id": "call_0_0",
                    "name": "send_notification",
                    "arguments": {"to": "ops", "text": "x"},
                },
                idempotency_key=f"{session.id}:4",
            ),
        ],
    )
    import time

    time.sleep(0.02)
    return run_inline(session)


def test_uncertain_call_is_shown_and_decided_in_the_dashboard(client, users):
    session = _uncertain_notify_session()
    assert session.status == Status.WAITING_INPUT
    client.force_login(users["operator"])
    page = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
    assert "Uncertain side effect" in page and "send_notification" in page
    attention = client.get(reverse("sessions:attention"))
    assert [s.id for s in attention.context["uncertain"]] == [session.id]
    url = reverse("sessions:action", args=[session.id, "uncertain"])
    bad = client.post(url, {"resolution": "record_result", "output": "{nope"}, **HX)
    assert bad.status_code == 400 and "not valid JSON" in bad.content.decode()
    ok = client.post(url, {"resolution": "record_result", "output": '{"message_id": "m-7"}'}, **HX)
    assert ok.status_code == 200 and "Result recorded by hand" in ok.content.decode()
    done = run_inline(session)
    assert done.final_answer == "Notification sent: m-7."
    assert AuditEvent.objects.filter(
        session=session, action="uncertain_record_result", actor=users["operator"]
    ).exists()
    result = Step.objects.filter(session=session, kind="tool_result").get()
    assert result.payload["recorded_by_operator"] == "olivia"


def test_uncertain_call_fail_and_rerun(client, users):
    from sessions_app.models import SideEffect

    failing = _uncertain_notify_session()
    client.force_login(users["operator"])
    response = client.post(
        reverse("sessions:action", args=[failing.id, "uncertain"]), {"resolution": "fail"}, **HX
    )
    assert response.status_code == 200
    failing.refresh_from_db()
    assert failing.status == Status.FAILED and "may or may not have happened" in failing.last_error

    again = _uncertain_notify_session()
    client.post(
        reverse("sessions:action", args=[again.id, "uncertain"]), {"resolution": "rerun"}, **HX
    )
    assert run_inline(again).status == Status.COMPLETED
    assert SideEffect.objects.filter(session_id=again.id).count() == 1
    bogus = client.post(
        reverse("sessions:action", args=[again.id, "uncertain"]), {"resolution": "rerun"}, **HX
    )
    assert (
        bogus.status_code == 409
        and "no tool call of this session is uncertain" in bogus.content.decode()
    )


def test_a_rejection_needs_a_reason_and_an_approval_or_a_fork_a_confirmation(
    client, users, waiting, tokens
):
    """A rejection tells the model why: without a reason it is refused, on the page and over
    the API, and nothing is written. Approving runs the tool and forking makes a session:
    the page asks before either (the text the actions table gives)."""
    from sessions_app.dashboard.actions import ACTIONS

    client.force_login(users["operator"])
    page = client.get(reverse("sessions:detail", args=[waiting.id])).content.decode()
    assert f'hx-confirm="{ACTIONS["approve"].confirm}"' in page
    assert 'aria-label="rejection reason" required' in page
    before = waiting.last_seq
    response = client.post(
        reverse("sessions:action", args=[waiting.id, "reject"]), {"reason": "  "}, **HX
    )
    assert (
        response.status_code == 400 and "say why the call is rejected" in response.content.decode()
    )
    api = client.post(
        f"/api/sessions/{waiting.id}/reject",
        {},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {tokens['operator']}",
    )
    assert api.status_code == 400 and "say why" in api.json()["detail"]
    waiting.refresh_from_db()
    assert waiting.last_seq == before and waiting.status == Status.WAITING_INPUT
    done = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it"))
    page = client.get(reverse("sessions:detail", args=[done.id])).content.decode()
    assert f'hx-confirm="{ACTIONS["fork"].confirm}"' in page


def test_a_reason_or_note_longer_than_the_api_allows_is_refused_from_the_dashboard_too(
    client, users, waiting
):
    """A person's reason is bounded on every face (a 2.4 MB reason was stored from the
    dashboard): refused with the field named, nothing written."""
    client.force_login(users["operator"])
    before = waiting.last_seq
    for action, field in [("reject", "reason"), ("approve", "reason")]:
        response = client.post(
            reverse("sessions:action", args=[waiting.id, action]), {field: "x" * 2001}, **HX
        )
        text = response.content.decode()
        assert response.status_code == 400 and "at most 2,000" in text, text[-500:]
    response = client.post(
        reverse("sessions:action", args=[waiting.id, "reject"]), {"reason": "y" * 2000}, **HX
    )
    assert response.status_code in (200, 204), response.content.decode()[-500:]
    waiting.refresh_from_db()
    assert waiting.last_seq == before + 1
