"""No stored state, however it got there (SQL by hand, an older bug), makes a page or an
API call answer 500: a head checkpoint this code cannot read is shown as such, and its
budgets are not applied."""

from __future__ import annotations

import pytest
from django.urls import reverse

from sessions_app.models import ApiToken, Checkpoint

from .test_state_upgrade import insert_fixture, upgrade

pytestmark = pytest.mark.django_db(transaction=True)

SPOILS = {
    "budget of 'ten'": lambda s: {**s, "budgets": {"max_steps": "ten"}},
    "cost of 'abc'": lambda s: {**s, "budgets": {**s["budgets"], "max_cost": "abc"}},
    "negative steps": lambda s: {**s, "budgets": {**s["budgets"], "max_steps": -3}},
    "uncertain calls as text": lambda s: {**s, "uncertain_calls": "x"},
    "turn as text": lambda s: {**s, "turn": "3"},
    "plan not a list": lambda s: {**s, "plan": {"p1": "x"}},
    "counters missing": lambda s: {k: v for k, v in s.items() if k != "counters"},
    "not an object": lambda s: "garbage",
}


@pytest.mark.parametrize("spoil", SPOILS.values(), ids=SPOILS.keys())
def test_a_state_this_code_cannot_read_breaks_no_page(spoil, client, users):
    session_id = insert_fixture("mid_run")
    upgrade()
    checkpoint = Checkpoint.objects.get(session_id=session_id, seq=7)
    Checkpoint.objects.filter(pk=checkpoint.pk).update(state=spoil(checkpoint.state))
    client.force_login(users["operator"])
    pages = {
        name: client.get(reverse(f"sessions:{name}", args=[session_id]))
        for name in ("detail", "panel", "steps", "timeline", "usage")
    }
    pages["list"] = client.get(reverse("sessions:list"))
    pages["attention"] = client.get(reverse("sessions:attention"))
    token = ApiToken.issue(users["operator"])[1]
    for path in ("", "/budgets", "/steps"):
        pages["api" + path] = client.get(
            f"/api/sessions/{session_id}{path}", HTTP_AUTHORIZATION=f"Bearer {token}"
        )
    assert {name: r.status_code for name, r in pages.items()} == dict.fromkeys(pages, 200)
