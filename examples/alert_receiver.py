"""Receive Respawn's alert webhooks: verify each one's signature, drop repeats, print it.

    RESPAWN_WEBHOOK_SECRET=whsec_... python examples/alert_receiver.py 8025

Then create a webhook rule in the dashboard (Alerts) pointing at http://<this host>:8025/
and paste the secret it shows you once. Uses only the standard library.

Each request carries three headers:

    Respawn-Signature: t=<unix time>,v1=<hex HMAC-SHA256>
    Respawn-Delivery:  <delivery id, a UUID: the same on every retry of one message>
    Respawn-Event:     alert.fired | alert.resolved | alert.test

The recipe (the scheme Stripe and GitHub use):
1. Take t and v1 from Respawn-Signature (there may be more than one v1 while a secret is
   being replaced: accept any that matches).
2. Compute HMAC-SHA256 with your secret as the key over the bytes  f"{t}." + raw body
   (the body exactly as received, before any JSON parsing), as lowercase hex.
3. Compare with v1 in constant time (hmac.compare_digest); refuse if none matches.
4. Refuse if t is further than TOLERANCE seconds from your clock (a replayed request).
5. Answer 2xx quickly. Respawn retries anything else with backoff; a delivery is at least
   once, so remember the Respawn-Delivery ids you have handled and ignore repeats.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

TOLERANCE = 300  # seconds


class BadSignature(Exception):
    pass


def verify(secret: str, body: bytes, header: str, *, now: float | None = None) -> None:
    """Raise BadSignature unless `header` (Respawn-Signature) signs `body` with `secret`
    within TOLERANCE seconds of `now`."""
    timestamp, signatures = None, []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            timestamp = value
        elif key == "v1":
            signatures.append(value)
    if timestamp is None or not timestamp.isdigit() or not signatures:
        raise BadSignature("malformed Respawn-Signature header")
    expected = hmac.new(
        secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    if not any(hmac.compare_digest(expected, s) for s in signatures):
        raise BadSignature("signature does not match")
    if abs((time.time() if now is None else now) - int(timestamp)) > TOLERANCE:
        raise BadSignature("timestamp outside the tolerance window")


class Receiver(BaseHTTPRequestHandler):
    secret = os.environ.get("RESPAWN_WEBHOOK_SECRET", "")
    seen: set[str] = set()  # keep these in your database in a real receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            verify(self.secret, body, self.headers.get("Respawn-Signature", ""))
        except BadSignature as exc:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(str(exc).encode())
            return
        delivery = self.headers.get("Respawn-Delivery", "")
        if delivery not in self.seen:
            self.seen.add(delivery)
            alert = json.loads(body)
            session = alert.get("session") or {}
            print(alert["type"], alert.get("reason"), session.get("url", ""), flush=True)
        self.send_response(204)
        self.end_headers()


if __name__ == "__main__":
    if not Receiver.secret:
        sys.exit("set RESPAWN_WEBHOOK_SECRET to the secret the rule showed you")
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8025
    print(f"listening on port {port}", flush=True)
    HTTPServer(("0.0.0.0", port), Receiver).serve_forever()
