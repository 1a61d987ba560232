import pytest
from django.urls import reverse

from sessions_app.models import AgentSession, Step

pytestmark = pytest.mark.django_db


def test_anonymous_is_sent_to_login(client):
    response = client.get(reverse("sessions:list"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_login_then_list_shows_sessions(client, users):
    session = AgentSession.objects.create(agent="demo", title="find me")
    assert client.login(username="victor", password="pw-viewer")
    response = client.get(reverse("sessions:list"))
    assert response.status_code == 200
    assert b"find me" in response.content
    assert str(session.id).encode() in response.content


def test_list_query_count_is_bounded(client, users, django_assert_max_num_queries):
    for i in range(30):
        AgentSession.objects.create(agent="demo", title=f"s{i}")
    client.force_login(users["viewer"])
    with django_assert_max_num_queries(6):
        response = client.get(reverse("sessions:list"))
    assert response.status_code == 200


def test_detail_escapes_untrusted_content(client, users):
    session = AgentSession.objects.create(agent="demo", title="<script>alert(1)</script>")
    Step.objects.create(
        session=session,
        seq=1,
        kind="tool_result",
        payload={"output": "<img src=x onerror=alert(1)>"},
    )
    client.force_login(users["viewer"])
    response = client.get(reverse("sessions:detail", args=[session.id]))
    assert response.status_code == 200
    assert b"<img src=x" not in response.content
    assert b"<script>alert(1)" not in response.content
    assert b"&lt;img src=x onerror=alert(1)&gt;" in response.content


def test_detail_of_missing_session_is_404(client, users):
    client.force_login(users["viewer"])
    response = client.get("/sessions/00000000-0000-0000-0000-000000000000/")
    assert response.status_code == 404


def test_outsider_without_a_role_gets_403(client, users):
    session = AgentSession.objects.create(agent="demo")
    client.force_login(users["outsider"])
    assert client.get(reverse("sessions:list")).status_code == 403
    assert client.get(reverse("sessions:detail", args=[session.id])).status_code == 403
