"""Every kind of secret the README says is redacted, sent through every way text reaches
Respawn, against real processes (a gunicorn web process with config/gunicorn.py, rqworker
processes, a local stub of a model provider): none of them is found afterwards in a
`pg_dump` of the database, in any page or API response, or in any process's log.

The ways in: the API (a session's input and title, messages, approve and reject reasons,
an uncertain call's note and recorded output), the dashboard (instructions, corrected tool
results, messages, reasons), the admin (a session's title, a step's payload, a
checkpoint's state, an API token's name), the User-Agent of every request, the log-in
form's username, the demo tools' effect rows (a payment memo, a notification), what the
(scripted) model repeats, a provider's error message, and URLs in the access log."""

from __future__ import annotations

import html
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from itertools import cycle
from pathlib import Path
from urllib.parse import quote, quote_plus, unquote_plus

import pytest
from django.db import connection

from sessions_app.models import AgentSession, ApiToken, Checkpoint, Status, Step
from tests.conftest import wait_for
from tests.servers import free_port
from tests.sessions_app.test_dashboard import _uncertain_notify_session
from tests.stubs.llm_servers import OPENAI_PATH, StubServer, openai_error

from .crawl import crawl
from .http import Browser, Reply

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]

# Secrets the deployment configures: matched literally, whatever they look like.
PROVIDER_KEY = "lab7Qx2Kw9Zr4Tn8Vb3Lm"  # OPENAI_API_KEY, of no known shape
ENV_SECRET = "payments5Hq8Wc2Rz7Jx4"  # named in RESPAWN_REDACT_ENV
CUSTOM = "ACME-731904"  # matched by RESPAWN_REDACT_PATTERNS

# How a deployment configures them.
SECRET_SETTINGS = {
    "OPENAI_API_KEY": PROVIDER_KEY,
    "RESPAWN_REDACT_ENV": "PAYMENTS_TOKEN",
    "PAYMENTS_TOKEN": ENV_SECRET,
    "RESPAWN_REDACT_PATTERNS": r"ACME-[0-9]{6}",
}

# kind -> (what must never be found, the text that carries it). One line each.
SECRETS: dict[str, tuple[str, str]] = {
    "openai": (
        "sk-proj-Tq4nW8zLm2Xv9Kc7Rb5Hp3Jd6Fs1Gy0A",
        "key sk-proj-Tq4nW8zLm2Xv9Kc7Rb5Hp3Jd6Fs1Gy0A",
    ),
    "anthropic": ("sk-ant-api03-Wm3Kp9Zq7Lx2Nv8Rt5Hb4Jc", "sk-ant-api03-Wm3Kp9Zq7Lx2Nv8Rt5Hb4Jc"),
    "aws-access": ("AKIAQ7ZLM3XW9KT2PV4N", "aws_access_key_id=AKIAQ7ZLM3XW9KT2PV4N"),
    "aws-secret": (
        "wJ7rXUtnFEMIk9MDENGbPxRfiCYzQ3KEY8pLm2Tq",
        "secret wJ7rXUtnFEMIk9MDENGbPxRfiCYzQ3KEY8pLm2Tq here",
    ),
    "github": (
        "ghp_Rk8Zq2Lm7Xw4Nv9Tb3Hc6Jp1Fs5Gy8Dk2Qw7",
        "ghp_Rk8Zq2Lm7Xw4Nv9Tb3Hc6Jp1Fs5Gy8Dk2Qw7",
    ),
    "slack": ("xoxb-4820-Wq7Zk3Lm9X", "xoxb-4820-Wq7Zk3Lm9X"),
    "google": (
        "AIzaSyQ7Lm2Xw9Kt4Pv8Nz3Rb6Hc1Jd5Fs0Gy7Q",
        "AIzaSyQ7Lm2Xw9Kt4Pv8Nz3Rb6Hc1Jd5Fs0Gy7Q",
    ),
    "stripe": ("sk_live_Z7q2Lm9Xw4Kt8Pv3Nb6R", "sk_live_Z7q2Lm9Xw4Kt8Pv3Nb6R"),
    "respawn-token": (
        "rsp_Kq8Zm3Lx7Wn2Tv9Rb4Hc6Jp1Fs5Gy8Dk",
        "rsp_Kq8Zm3Lx7Wn2Tv9Rb4Hc6Jp1Fs5Gy8Dk",
    ),
    "jwt": (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJyZXNwYXduIn0.Qw8Zk2Lm7Xv4Nt9Rb3Hc6",
        "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJyZXNwYXduIn0.Qw8Zk2Lm7Xv4Nt9Rb3Hc6",
    ),
    "bearer": ("Zq7Lm2Xw9Kt4Pv8Nz3Rb", "Authorization: Bearer Zq7Lm2Xw9Kt4Pv8Nz3Rb"),
    "basic": ("cmVzcGF3bjpodW50ZXIyLTc3", "Authorization: Basic cmVzcGF3bjpodW50ZXIyLTc3"),
    "url-password": ("Pw7@r/Zk9q", "postgres://app:Pw7@r/Zk9q@db.internal:5432/app"),
    "url-no-user": ("Rd4sQ9wLx2", "redis://:Rd4sQ9wLx2@cache:6379/0"),
    "db_password": ("Vq8pw77Lk", '{"db_password": "Vq8pw77Lk"}'),
    "token": ("Tk3Zq9Lm2Wx", '{"token": "Tk3Zq9Lm2Wx"}'),
    "passphrase": ("Pp5Zx8Wq2Lm", "passphrase=Pp5Zx8Wq2Lm"),
    "aws_secret_access_key": ("Aw2Kq9Zm7Lx", '{"aws_secret_access_key": "Aw2Kq9Zm7Lx"}'),
    "gitlab": ("glpat-u8jzPde0IgxLd6GncfBA", "clone with glpat-u8jzPde0IgxLd6GncfBA"),
    "npm": (
        "npm_epfJBd0Kh8oOOL8dKLzdocJ2isAjIhKtJ0Rl",
        "//registry/:_authToken npm_epfJBd0Kh8oOOL8dKLzdocJ2isAjIhKtJ0Rl",
    ),
    "pypi": (
        "pypi-AgEIcHlwaS5vcmcgLKOmxgJTeKdNnFRIBXuDL7DxtpYlSXpfKtHF4vUCsMehGAkWv",
        "upload with pypi-AgEIcHlwaS5vcmcgLKOmxgJTeKdNnFRIBXuDL7DxtpYlSXpfKtHF4vUCsMehGAkWv",
    ),
    "huggingface": (
        "hf_j7FAc9QeWJKY40uvSwMFLZDe1f8rESQedU",
        "model pull hf_j7FAc9QeWJKY40uvSwMFLZDe1f8rESQedU",
    ),
    "sendgrid": (
        "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",
        "mail via 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",
    ),
    "shopify": (
        "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",
        "store admin 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",
    ),
    "digitalocean": (
        "dop_v1_026c48bbf33feff9243a8f506b40928b5b7a767c76fb008f86bebb2737f6a6f0",
        "doctl dop_v1_026c48bbf33feff9243a8f506b40928b5b7a767c76fb008f86bebb2737f6a6f0",
    ),
    "mailgun": (
        "key-E6PwZPf1Qh6yYTWmE4lBYOvfZ8UzDzV8",
        "mailgun key-E6PwZPf1Qh6yYTWmE4lBYOvfZ8UzDzV8",
    ),
    "square": ("sq0atp-fUkkibjL5DZPjN0MEQ7wjJ", "square sq0atp-fUkkibjL5DZPjN0MEQ7wjJ"),
    "databricks": (
        "dapi40034d6608697a8d41bed440e50454f3",
        "warehouse dapi40034d6608697a8d41bed440e50454f3",
    ),
    "google-oauth": (
        "ya29.a0JduRHHJEYXg4JdpmrcXgGCJbW56eCu",
        "gcloud ya29.a0JduRHHJEYXg4JdpmrcXgGCJbW56eCu",
    ),
    "slack-webhook": (
        "AhzCueQpBenQtYh5Xj8TPQxj",
        "post to https://hooks.slack.com/services/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",
    ),
    "age": (
        "AGE-SECRET-KEY-1QI3OGZ5KOK16ZV0MWUFXBV932BYV7S6EHOGFQRCLRI1QZJ865UFRDL1ERB",
        "AGE-SECRET-KEY-1QI3OGZ5KOK16ZV0MWUFXBV932BYV7S6EHOGFQRCLRI1QZJ865UFRDL1ERB",
    ),
    "vault": ("hvs.OfZqfM2oeq3hDavJA76rNicH", "vault login hvs.OfZqfM2oeq3hDavJA76rNicH"),
    "linear": (
        "lin_api_Tp8hkqdlm7tOtHWnsCGRlrwZbqcabUGJmGEp7CgQ",
        "issues lin_api_Tp8hkqdlm7tOtHWnsCGRlrwZbqcabUGJmGEp7CgQ",
    ),
    "doppler": (
        "dp.pt.0PBQFI14zGtSnovm14TUOizwd1iaeOV4qBkdfQ1y3GQ",
        "doppler dp.pt.0PBQFI14zGtSnovm14TUOizwd1iaeOV4qBkdfQ1y3GQ",
    ),
    "grafana": (
        "glsa_sMpSscDlkrCaqx9vJupc94tnwlavyfEr_6702824c",
        "dashboards glsa_sMpSscDlkrCaqx9vJupc94tnwlavyfEr_6702824c",
    ),
    "telegram": (
        "7123456789:AALczbttOofL9H2WjQ5TY4MyWuUFjsUNPjc",
        "bot 7123456789:AALczbttOofL9H2WjQ5TY4MyWuUFjsUNPjc",
    ),
    "sentry": (
        "sntrys_01T5GOBUSZGi6HWGK10Zb0RLZ5TR9SPofbciOx9g",
        "releases sntrys_01T5GOBUSZGi6HWGK10Zb0RLZ5TR9SPofbciOx9g",
    ),
    "azure-account-key": (
        "2yeE6RsXcNOPmeMjvqPVStNKiaEdFrRgSnRFsTHsDDDXh5Jmtf7EbsDe0G9Cryn687neLfjVHq8xiM0OGr4hTx",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=2yeE6RsXcNOPmeMjvqPVStNKiaEdFr"
        "RgSnRFsTHsDDDXh5Jmtf7EbsDe0G9Cryn687neLfjVHq8xiM0OGr4hTx==;EndpointSuffix=core.windows.net",
    ),
    "provider-key": (PROVIDER_KEY, f"the lab key is {PROVIDER_KEY} ok"),
    "env-secret": (ENV_SECRET, f"payments {ENV_SECRET}"),
    "custom-pattern": (CUSTOM, f"order {CUSTOM}"),
}
PEM_BODY = "MIIEowIBAAKCAQEAq7ZLm3XW9KT2PV4NQz8Rb6Hc1Jd5Fs0Gy7"
PEM = f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----"
PGP_BODY = "lQOYBGXk7ZsBCADoF54Fzbka8FRCztUjAwyuh1vauWv1zh87mTa5Vsq"
PGP = (
    "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n"
    f"{PGP_BODY}\n=Xq7Z\n-----END PGP PRIVATE KEY BLOCK-----"
)
NEVER = [secret for secret, _ in SECRETS.values()] + [PEM_BODY, PGP_BODY]
ALL_IN_ONE = "\n".join(text for _, text in SECRETS.values()) + "\n" + PEM + "\n" + PGP
# A reason or a note holds at most 2,000 characters: the corpus goes in two halves, each
# through an API field and a dashboard field of that kind.
_HALF = len(SECRETS) // 2
REASONS = (
    "\n".join(text for _, text in list(SECRETS.values())[:_HALF]) + "\n" + PEM,
    "\n".join(text for _, text in list(SECRETS.values())[_HALF:]) + "\n" + PGP,
)
AS_JSON = {
    "db_password": "Vq8pw77Lk",
    "token": "Tk3Zq9Lm2Wx",
    "private_key": PEM,
    "passphrase": "Pp5Zx8Wq2Lm",
    "aws_secret_access_key": "Aw2Kq9Zm7Lx",
    "text": ALL_IN_ONE,
}


@pytest.fixture
def deployment(worker_env, tmp_path):
    """The environment web and workers share: the same secrets, configured once."""
    env = {
        **worker_env,
        **SECRET_SETTINGS,
        "RESPAWN_LOGIN_MAX_PER_IP": "1000",
        "RESPAWN_LOGIN_MAX_PER_ACCOUNT": "1000",
        "RESPAWN_DB_POOL": "1",
    }
    port = free_port()
    out, err = tmp_path / "web.out", tmp_path / "web.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "-c",
                "config/gunicorn.py",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                "2",
                "--access-logfile",
                "-",
                "config.wsgi",
            ],
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(url, server), timeout=30, what="the web process")
        yield {"env": env, "url": url, "logs": [out, err]}
    finally:
        server.terminate()
        server.wait(timeout=15)


def _up(url: str, server: subprocess.Popen) -> bool:
    if server.poll() is not None:
        pytest.fail("the web process exited")
    try:
        return Browser(url).get("/login/").status == 200
    except OSError:  # not listening yet
        return False


def api(browser: Browser, token: str, method: str, path: str, body=None):
    data = json.dumps(body).encode() if body is not None else None
    reply = browser.request(
        method,
        path,
        data=data,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    return reply.status, (json.loads(reply.body) if reply.body else None)


def settled(*ids) -> bool:
    return not AgentSession.objects.filter(
        id__in=ids, status__in=[Status.QUEUED, Status.RUNNING]
    ).exists()


def test_no_secret_reaches_the_database_a_page_or_a_log(deployment, start_worker, users, tmp_path):
    from django.contrib.auth.models import User

    User.objects.create_superuser("sue", password="pw-sue")
    operator_token = ApiToken.issue(users["operator"], name="ci")[1]
    uncertain = _uncertain_notify_session()  # before a worker runs: it waits for a person
    worker = start_worker(
        **{k: v for k, v in deployment["env"].items() if k not in ("RESPAWN_DB_POOL",)}
    )
    agents = cycle(text for _, text in SECRETS.values())
    url = deployment["url"]

    def browser(**kwargs) -> Browser:
        # Each request of this browser carries the next secret in its User-Agent.
        b = Browser(url, **kwargs)
        original = b.request

        def request(method, path, data=None, headers=None):
            b.user_agent = f"probe/1.0 {next(agents)}"
            return original(method, path, data=data, headers=headers)

        b.request = request  # type: ignore[method-assign]
        return b

    client = browser()

    # --- The API ---------------------------------------------------------------------------
    status, echo = api(
        client,
        operator_token,
        "POST",
        "/api/sessions",
        {"agent": "echo", "input": ALL_IN_ONE, "title": SECRETS["github"][1]},
    )
    assert status == 201, echo
    titled = []
    for kind, (_, text) in SECRETS.items():
        status, body = api(
            client,
            operator_token,
            "POST",
            "/api/sessions",
            {"agent": "echo", "input": kind, "title": text},
        )
        assert status == 201, body
        titled.append(body["id"])
    status, notify = api(
        client, operator_token, "POST", "/api/sessions", {"agent": "notify", "input": ALL_IN_ONE}
    )
    status, pay = api(
        client, operator_token, "POST", "/api/sessions", {"agent": "approval", "input": ALL_IN_ONE}
    )
    status, pay2 = api(
        client,
        operator_token,
        "POST",
        "/api/sessions",
        {"agent": "approval", "input": "pay 3 to X"},
    )
    status, demo = api(
        client,
        operator_token,
        "POST",
        "/api/sessions",
        {"agent": "demo", "input": "what is (12*7)+3, then save it as a note"},
    )
    ids = [echo["id"], notify["id"], pay["id"], pay2["id"], demo["id"], *titled]
    wait_for(lambda: settled(*ids), timeout=60, what="the first runs")
    status, body = api(
        client,
        operator_token,
        "POST",
        f"/api/sessions/{echo['id']}/messages",
        {"content": ALL_IN_ONE},
    )
    assert status == 202, body
    status, body = api(
        client, operator_token, "POST", f"/api/sessions/{pay['id']}/approve", {"reason": REASONS[0]}
    )
    assert status == 202, body
    status, body = api(
        client,
        operator_token,
        "POST",
        f"/api/sessions/{uncertain.id}/uncertain",
        {"resolution": "record_result", "output": AS_JSON, "note": REASONS[1]},
    )
    assert status == 202, body

    # --- The dashboard ---------------------------------------------------------------------
    operator = browser()
    assert operator.log_in("olivia", "pw-operator").status == 302
    wait_for(
        lambda: settled(echo["id"], pay["id"], uncertain.id),
        timeout=60,
        what="the API's edits to run",
    )
    detail = f"/sessions/{pay2['id']}/"
    reply = operator.post_form(
        f"/sessions/{pay2['id']}/actions/reject/", {"reason": REASONS[1]}, form_page=detail
    )
    assert reply.status == 302, reply.status
    demo_page = f"/sessions/{demo['id']}/"
    result_seq = (
        Step.objects.filter(session_id=demo["id"], kind="tool_result").order_by("seq").first().seq
    )
    reply = operator.post_form(
        f"/sessions/{demo['id']}/actions/correct/",
        {"result_seq": str(result_seq), "output": json.dumps(AS_JSON), "note": REASONS[0]},
        form_page=demo_page,
    )
    assert reply.status == 302
    wait_for(lambda: settled(demo["id"], pay2["id"]), timeout=60, what="the corrected session")
    reply = operator.post_form(
        f"/sessions/{demo['id']}/actions/instruct/", {"text": ALL_IN_ONE}, form_page=demo_page
    )
    assert reply.status == 302
    wait_for(lambda: settled(demo["id"]), timeout=60, what="the instructed session")
    reply = operator.post_form(
        f"/sessions/{demo['id']}/actions/message/", {"content": ALL_IN_ONE}, form_page=demo_page
    )
    assert reply.status == 302

    # --- The admin -------------------------------------------------------------------------
    admin = browser()
    assert admin.log_in("sue", "pw-sue", admin=True).status == 302
    change = f"/admin/sessions_app/agentsession/{titled[0]}/change/"
    for _, text in SECRETS.values():
        assert admin.post_form(change, {"title": text}).status == 302
    wait_for(lambda: settled(demo["id"]), timeout=60, what="the last message")
    step = Step.objects.filter(session_id=demo["id"], kind="tool_result").order_by("seq").first()
    payload = {**step.payload, "output": AS_JSON}
    reply = admin.post_form(
        f"/admin/sessions_app/step/{step.pk}/change/", {"payload": json.dumps(payload)}
    )
    assert reply.status == 302, reply.body[-2000:]
    session = AgentSession.objects.get(id=demo["id"])
    head = Checkpoint.objects.filter(session=session, seq=session.head).order_by("-id").first()
    state = {**head.state, "final_answer": ALL_IN_ONE}
    reply = admin.post_form(
        f"/admin/sessions_app/checkpoint/{head.pk}/change/", {"state": json.dumps(state)}
    )
    assert reply.status == 302, reply.body[-2000:]
    for _, text in SECRETS.values():
        sue = User.objects.get(username="sue").pk
        reply = admin.post_form(
            "/admin/sessions_app/apitoken/add/", {"user": str(sue), "name": text[:100]}
        )
        assert reply.status == 200 and "issued-token" in reply.body

    # --- Log-in forms, URLs --------------------------------------------------------------
    for _, text in SECRETS.values():
        assert browser().log_in(text[:150], "wrong").status == 200
        assert browser().log_in(text[:150], "wrong", admin=True).status == 200
        operator.get(f"/sessions/?q={quote_plus(text)}")
        operator.get(f"/sessions/{quote(text, safe='')}/")  # a 404, logged with its path

    # --- A provider's error, in the worker ---------------------------------------------------
    worker.stop()
    with StubServer(OPENAI_PATH) as provider:
        provider.script(
            openai_error(401, f"Incorrect API key provided: {PROVIDER_KEY}. Seen: {ALL_IN_ONE}")
        )
        failing = start_worker(
            **{k: v for k, v in deployment["env"].items() if k != "RESPAWN_DB_POOL"},
            RESPAWN_MODEL="openai:gpt-test",
            OPENAI_BASE_URL=provider.url + "/v1",
            RESPAWN_MODEL_RETRIES="0",
        )
        status, failed = api(
            client, operator_token, "POST", "/api/sessions", {"agent": "echo", "input": "hi"}
        )
        wait_for(lambda: settled(failed["id"]), timeout=60, what="the failing run")
        failing.stop()
        assert provider.requests, "the provider was never called"
    failed_session = AgentSession.objects.get(id=failed["id"])
    assert failed_session.status == Status.FAILED and "401" in failed_session.last_error

    # --- Everything went in... -----------------------------------------------------------
    assert AgentSession.objects.get(id=pay["id"]).status == Status.COMPLETED
    assert Step.objects.filter(session_id=notify["id"], kind="tool_result").exists()
    dump = subprocess.run(
        ["pg_dump", "--no-owner", *_pg_args(), connection.settings_dict["NAME"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert dump.count("[REDACTED:") > 300, "the secrets never reached the database at all"
    for table in (
        "sessions_app_sideeffect",
        "django_admin_log",
        "sessions_app_apitoken",
        "sessions_app_auditevent",
    ):
        assert f"COPY public.{table} " in dump
    assert "[REDACTED:" in _table(dump, "sessions_app_sideeffect")
    assert "[REDACTED:" in _table(dump, "django_admin_log")

    # --- ...and no secret came out -----------------------------------------------------
    found = {secret: "pg_dump" for secret in NEVER if secret in dump}
    pages = _every_page(url, operator_token)
    assert len(pages) > 300
    for where, body in pages.items():
        text = html.unescape(body) + unquote_plus(html.unescape(body))
        for secret in NEVER:
            if secret in text:
                found.setdefault(secret, where)
    logs = "\n".join(path.read_text(errors="replace") for path in deployment["logs"])
    logs += worker.log() + failing.log()
    assert "GET /sessions/?q=" in logs  # the access log holds the request lines
    logs += unquote_plus(logs)
    for secret in NEVER:
        if secret in logs:
            found.setdefault(secret, "a log")
    if found:
        for line in logs.splitlines():
            if any(s in line for s in found):
                print("LEAK", line[:300])
    assert not found, f"secrets found: {found}"


def _pg_args() -> list[str]:
    db = connection.settings_dict
    return [
        "-h",
        db.get("HOST") or "127.0.0.1",
        "-p",
        str(db.get("PORT") or 5432),
        "-U",
        db.get("USER") or "postgres",
    ]


def _table(dump: str, table: str) -> str:
    start = dump.index(f"COPY public.{table} ")
    return dump[start : dump.index("\\.\n", start)]


def _every_page(url: str, token: str) -> dict[str, str]:
    """Every page a superuser reads, as served by the web process: each kind of page (the
    crawl of tests/security/crawl.py), and every page of every session, step, checkpoint,
    audit event and token; and every API read."""
    from django.contrib.admin.models import LogEntry
    from django.urls import Resolver404, resolve

    from sessions_app.models import AuditEvent

    reader = Browser(url)
    assert reader.log_in("sue", "pw-sue", admin=True).status == 302
    pages: dict[str, str] = {}
    read: dict[str, Reply] = {}

    def get(path: str) -> Reply:
        reply = reader.get(path)
        assert reply.status < 500, path
        return reply

    def fetch(path: str) -> tuple[int, str, str]:
        reply = read.pop(path, None) or get(path)
        pages[path] = reply.body
        return reply.status, reply.headers.get("Content-Type", ""), reply.body

    def route(path: str) -> str:
        try:
            return resolve(path).view_name
        except Resolver404:
            return path

    session_ids = [str(i) for i in AgentSession.objects.values_list("id", flat=True)]
    start = ["/sessions/", "/sessions/attention/", "/audit/", "/admin/", "/admin/rq/"]
    for session_id in session_ids:
        start += [
            f"/sessions/{session_id}/",
            f"/sessions/{session_id}/diff/",
            f"/admin/sessions_app/agentsession/{session_id}/change/",
            f"/admin/sessions_app/agentsession/{session_id}/history/",
        ]
    for model, rows in [
        ("step", Step.objects.values_list("pk", flat=True)),
        ("checkpoint", Checkpoint.objects.values_list("pk", flat=True)),
        ("auditevent", AuditEvent.objects.values_list("pk", flat=True)),
    ]:
        start += [f"/admin/sessions_app/{model}/{pk}/change/" for pk in rows]
    start += ["/admin/sessions_app/apitoken/", "/admin/sessions_app/auditevent/"]
    assert LogEntry.objects.exists()
    # The pages named above are read two at a time (the web process has two workers).
    with ThreadPoolExecutor(max_workers=2) as pool:
        read.update(zip(start, pool.map(get, start), strict=True))
    crawl(
        fetch,
        start,
        allowed=lambda p: "logout" not in p and "/delete/" not in p,
        route=route,
        limit=5000,
    )
    api_reads = ["/api/sessions?limit=200"]
    for session_id in session_ids:
        api_reads += [f"/api/sessions/{session_id}", f"/api/sessions/{session_id}/steps?limit=200"]
    for path in api_reads:
        status, body = api(reader, token, "GET", path)
        assert status == 200, (path, body)
        pages[path] = json.dumps(body, ensure_ascii=False)
    return pages
