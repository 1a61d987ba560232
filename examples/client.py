"""Talk to Respawn over HTTP: start a demo session, wait for its answer, ask a follow-up.

    python examples/client.py http://127.0.0.1:8000 $TOKEN

Uses only the standard library. The token comes from `manage.py create_api_token USER`
(a user in the operator group).
"""

import json
import sys
import time
import urllib.request


def call(base, token, method, path, body=None):
    request = urllib.request.Request(
        base.rstrip("/") + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def wait(base, token, session_id, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        session = call(base, token, "GET", f"/api/sessions/{session_id}")
        if session["status"] in ("completed", "failed", "waiting_input", "paused", "cancelled"):
            return session
        if time.monotonic() > deadline:
            raise SystemExit(f"session {session_id} still {session['status']} after {timeout}s")
        time.sleep(0.5)


def main(base, token):
    session = call(
        base,
        token,
        "POST",
        "/api/sessions",
        {"agent": "demo", "input": "what is (12*7)+3, then save it as a note"},
    )
    print("started", session["id"])
    session = wait(base, token, session["id"])
    print("answer 1:", session["final_answer"])

    call(
        base, token, "POST", f"/api/sessions/{session['id']}/messages", {"content": "what is 6*7?"}
    )
    session = wait(base, token, session["id"])
    print("answer 2:", session["final_answer"])

    steps = call(base, token, "GET", f"/api/sessions/{session['id']}/steps?limit=200")
    print("steps:", " ".join(f"{s['seq']}:{s['kind']}" for s in steps["items"]))


if __name__ == "__main__":
    main(*sys.argv[1:3])
