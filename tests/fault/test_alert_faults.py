"""Alerts against real workers and real receivers on loopback: a webhook within seconds of
a session starting to wait, a receiver down for a while (seconds here: config.settings_test
shortens the backoff), a worker SIGKILLed while its request is in flight, Redis flushed.
Counted: every event delivered, none accepted twice, every signature verifies."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sessions_app.models import AlertDelivery, AlertEvent, DeliveryStatus, Status
from sessions_app.services.alerts import alert_rule_create
from sessions_app.services.core import session_start

from ..conftest import wait_for, wait_for_status
from ..servers import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from alert_receiver import verify  # noqa: E402  (the documented recipe)

pytestmark = [pytest.mark.fault, pytest.mark.django_db(transaction=True)]


class Receiver:
    """A webhook receiver on a fixed loopback port, started and stopped at will. While
    `hold` is set, a request waits for it to clear and is then dropped unanswered."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.server: ThreadingHTTPServer | None = None
        self.requests: list[tuple[dict[str, str], bytes, int | None, float]] = []
        self.hold = threading.Event()
        self.held = threading.Event()  # a request is being held

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if receiver.hold.is_set():
                    receiver.held.set()
                    while receiver.hold.is_set():
                        time.sleep(0.05)
                    receiver.requests.append((dict(self.headers), body, None, time.time()))
                    self.close_connection = True
                    return  # no answer: the sender saw no 2xx
                receiver.requests.append((dict(self.headers), body, 200, time.time()))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def accepted(self) -> list[str]:
        return [h["Respawn-Delivery"] for h, _, code, _ in self.requests if code == 200]


@pytest.fixture
def receiver():
    made = Receiver(free_port())
    yield made
    made.hold.clear()
    made.stop()


def approval_rule(url: str) -> str:
    _, secret = alert_rule_create(
        name="on-call", agent="approval", reasons=["approval"], channel="webhook", target=url
    )
    return secret


def assert_exactly_once(receiver: Receiver, secret: str, sessions) -> None:
    """Every session's alert accepted exactly once, each signature verifying."""
    deliveries = list(AlertDelivery.objects.filter(kind="fired").select_related("event"))
    assert {d.event.session_id for d in deliveries} == {s.id for s in sessions}
    assert all(d.status == DeliveryStatus.DELIVERED for d in deliveries)
    accepted = receiver.accepted()
    assert sorted(accepted) == sorted(str(d.uid) for d in deliveries)  # none twice
    for headers, body, code, _ in receiver.requests:
        if code == 200:
            verify(secret, body, headers["Respawn-Signature"])


def test_a_signed_webhook_within_seconds_of_a_session_starting_to_wait(fleet, receiver):
    receiver.start()
    secret = approval_rule(receiver.url)
    fleet.start()
    session = session_start(agent="approval", input="pay invoice 9")
    wait_for_status(session, Status.WAITING_INPUT, timeout=60)
    wait_for(receiver.accepted, timeout=20, what="the webhook")
    event = AlertEvent.objects.get()
    headers, body, _, received = receiver.requests[0]
    latency = received - event.opened_at.timestamp()
    print(f"webhook received {latency:.2f}s after the session started to wait")
    assert latency < 5, f"the webhook came {latency:.1f}s after the session started to wait"
    assert json.loads(body)["session"]["id"] == str(session.id)
    assert_exactly_once(receiver, secret, [session])


def test_a_receiver_down_for_a_while_and_redis_flushed_lose_nothing(fleet, receiver, private_redis):
    secret = approval_rule(receiver.url)  # nothing listens there yet
    fleet.start()
    fleet.start()
    sessions = [session_start(agent="approval", input=f"pay invoice {n}") for n in range(4)]
    for session in sessions:
        wait_for_status(session, Status.WAITING_INPUT, timeout=60)
    wait_for(
        lambda: AlertDelivery.objects.filter(attempts__gte=2).count() == len(sessions),
        timeout=30,
        what="every delivery to have failed twice",
    )
    private_redis.flushall()  # the outbox is in PostgreSQL: nothing to lose there
    time.sleep(2)
    receiver.start()
    wait_for(
        lambda: (
            AlertDelivery.objects.filter(status=DeliveryStatus.DELIVERED).count() == len(sessions)
        ),
        timeout=30,
        what="every delivery after the outage",
    )
    time.sleep(2)  # and nothing more comes
    assert_exactly_once(receiver, secret, sessions)
    failed = AlertDelivery.objects.filter(kind="fired").values_list("last_error", flat=True)
    assert all(error == "" for error in failed)


def test_a_worker_killed_mid_delivery_is_retried_after_its_claim_and_delivered_once(
    fleet, receiver
):
    receiver.start()
    receiver.hold.set()  # the first request hangs, unanswered
    secret = approval_rule(receiver.url)
    # A 3 s timeout: its claim lasts 2 x 3 + 2 = 8 s, and it is killed well before it
    # would give up on the request.
    first = fleet.start(RESPAWN_ALERT_TIMEOUT="3")
    session = session_start(agent="approval", input="pay invoice 9")
    wait_for_status(session, Status.WAITING_INPUT, timeout=60)
    assert receiver.held.wait(20), "no request reached the receiver"
    first.kill()  # SIGKILL while its request is in flight
    killed_at = time.time()
    delivery = AlertDelivery.objects.get()
    assert delivery.status == DeliveryStatus.SENDING and delivery.attempts == 1
    receiver.hold.clear()  # the held request ends without an answer
    fleet.start()
    wait_for(
        lambda: AlertDelivery.objects.filter(status=DeliveryStatus.DELIVERED).exists(),
        timeout=40,
        what="the delivery by another worker after the claim ran out",
    )
    delivery.refresh_from_db()
    assert delivery.attempts == 2
    time.sleep(1.5)  # nothing more comes
    assert_exactly_once(receiver, secret, [session])
    (unanswered, delivered) = receiver.requests
    assert unanswered[2] is None and delivered[2] == 200
    assert unanswered[0]["Respawn-Delivery"] == delivered[0]["Respawn-Delivery"]
    # Sent again only once the dead worker's claim ran out, not while it might be sending.
    assert delivered[3] - killed_at > 8 - 2 - 1
