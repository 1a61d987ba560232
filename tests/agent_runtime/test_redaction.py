import pytest

from agent_runtime.redaction import Redactor

from .helpers import new_session, run

FAKES = {
    "openai-key": "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "anthropic-key": "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123",
    "aws-access-key": "AKIAIOSFODNN7EXAMPLE",
    "github-token": "ghp_" + "a1B2c3D4e5" * 4,
    "slack-token": "xoxb-1234567890-abcdefghij",
    "google-api-key": "AIza" + "B" * 35,
    "stripe-key": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "respawn-token": "rsp_" + "x" * 40,
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "gitlab-token": "glpat-u8jzPde0IgxLd6GncfBA",
    "npm-token": "npm_epfJBd0Kh8oOOL8dKLzdocJ2isAjIhKtJ0Rl",
    "pypi-token": "pypi-AgEIcHlwaS5vcmcgLKOmxgJTeKdNnFRIBXuDL7DxtpYlSXpfKtHF4vUCsMehGAkWv",
    "huggingface-token": "hf_j7FAc9QeWJKY40uvSwMFLZDe1f8rESQedU",
    "sendgrid-key": "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",
    "shopify-token": "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",
    "digitalocean-token": "dop_v1_" + "026c48bbf33feff9" * 4,
    "mailgun-key": "key-E6PwZPf1Qh6yYTWmE4lBYOvfZ8UzDzV8",
    "square-token": "sq0atp-fUkkibjL5DZPjN0MEQ7wjJ",
    "databricks-token": "dapi40034d6608697a8d41bed440e50454f3",
    "google-oauth-token": "ya29.a0JduRHHJEYXg4JdpmrcXgGCJbW56eCu",
    "slack-webhook": "https://hooks.slack.com/services/T066MR2684/B06P7Q9M2I/AhzCueQpBenQtYh5Xj8T",
    "age-secret-key": "AGE-SECRET-KEY-1"
    + "QI3OGZ5KOK16ZV0MWUFXBV932BYV7S6EHOGFQRCLRI1QZJ865UFRDL1ERB",
    "vault-token": "hvs.OfZqfM2oeq3hDavJA76rNicH",
    "linear-key": "lin_api_Tp8hkqdlm7tOtHWnsCGRlrwZbqcabUGJmGEp7CgQ",
    "doppler-token": "dp.pt.0PBQFI14zGtSnovm14TUOizwd1iaeOV4qBkdfQ1y3GQ",
    "grafana-token": "glsa_sMpSscDlkrCaqx9vJupc94tnwlavyfEr_6702824c",
    "telegram-bot-token": "7123456789:AALczbttOofL9H2WjQ5TY4MyWuUFjsUNPjc",
    "sentry-token": "sntrys_01T5GOBUSZGi6HWGK10Zb0RLZ5TR9SPofbciOx9g",
    "private-key": "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBGXk\n-----END PGP PRIVATE KEY BLOCK-----",
}


@pytest.mark.parametrize("kind", sorted(FAKES))
def test_known_key_shapes_are_replaced(kind):
    text = f"here it is: {FAKES[kind]} (keep it safe)"
    out = Redactor().text(text)
    assert FAKES[kind] not in out
    assert f"[REDACTED:{kind}]" in out
    assert out.startswith("here it is: ") and out.endswith("(keep it safe)")


def test_passwords_in_urls_bearer_tokens_and_private_keys():
    r = Redactor()
    assert (
        r.text("postgres://app:hunter22@db:5432/x")
        == "postgres://app:[REDACTED:password]@db:5432/x"
    )
    assert "abcdefghijklmnop1234" not in r.text("Authorization: Bearer abcdefghijklmnop1234")
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----"
    assert r.text(f"key:\n{pem}\nend") == "key:\n[REDACTED:private-key]\nend"


def test_ordinary_text_is_left_alone():
    r = Redactor()
    for text in [
        "what is (12*7)+3",
        "skip-this-step",
        "a task about AKIA",
        "Bearer of bad news",
        "https://example.com/a?b=c",
    ]:
        assert r.text(text) == text


def test_configured_secrets_extra_patterns_and_secret_keys():
    r = Redactor(extra_patterns=[r"ACME-\d{6}"], secrets=["my-very-own-key-123"])
    value = {
        "note": "key my-very-own-key-123 and ACME-123456",
        "password": "plain",
        "items": ["sk-" + "z" * 30],
    }
    out = r.redact(value)
    assert out == {
        "note": "key [REDACTED:configured-secret] and [REDACTED:custom-1]",
        "password": "[REDACTED:password]",
        "items": ["[REDACTED:openai-key]"],
    }
    with pytest.raises(ValueError, match="not a valid regex"):
        Redactor(extra_patterns=["(unclosed"])


def test_loop_never_stores_a_secret_from_a_tool_result():
    from agent_runtime.agents import Agent, AgentRegistry
    from agent_runtime.providers import ModelTurn, ToolCall
    from agent_runtime.store import InMemoryStore
    from agent_runtime.tools import ToolContext, tool

    secret = FAKES["openai-key"]

    @tool
    def leak(ctx: ToolContext) -> dict:
        """Returns a credential it found."""
        ctx.remember(f"doc-with-{secret}")
        return {"found": f"OPENAI_API_KEY={secret}"}

    class Model:
        def complete(self, messages, tools, settings):
            if messages[-1].role == "tool":
                return ModelTurn(text=f"The key is {secret}")
            return ModelTurn(text=None, tool_calls=[ToolCall("c1", "leak", {})])

    agents = AgentRegistry([Agent(name="leaky", model="scripted:echo", tools=[leak])])
    store = InMemoryStore()
    session_id = new_session(store, "leaky", "find keys")
    run(
        store,
        session_id,
        agents=agents,
        make_provider=lambda s, o: (Model(), "m"),
        config={"redactor": Redactor()},
    )
    session = store.session(session_id)
    stored = repr([s.payload for s in session.steps]) + repr(
        [c.state.to_dict() for c in session.checkpoints]
    )
    assert secret not in stored
    assert "[REDACTED:openai-key]" in stored


def test_the_literal_prefilter_redacts_exactly_what_every_regex_would():
    """Patterns whose literals are absent are skipped; that must never let a secret
    through. Compared with a redactor that runs every regex on every string, on the known
    shapes in odd cases and surroundings, and on text with near misses."""

    from agent_runtime import redaction

    class Unfiltered(Redactor):
        def text(self, value: str) -> str:
            return self._scan(value, prefilter=False)

    samples = [f"x {fake} y" for fake in FAKES.values()]
    samples += [f"({fake})\n" for fake in FAKES.values()]
    samples += [
        "AUTHORIZATION: BEARER abcdefghijklmnop1234",
        "authorization: bEaReR abcdefghijklmnop1234",
        "HTTPS://user:secret@EXAMPLE.com/",
        "-----BEGIN EC PRIVATE KEY-----\nabc",
        "sk-short ghp_short AKIAshort eyJ.eyJ. rsp_ xox- AIza sk_live_",
        "plain text with no secrets at all, " * 8,
    ]
    for sample in samples:
        assert Redactor().text(sample) == Unfiltered().text(sample), sample
    # Every built-in rule with literals names one that each of its matches contains.
    for rule in redaction.RULES:
        if not rule.literals:
            continue
        for fake in [
            *FAKES.values(),
            "Bearer abcdefghijklmnop1234",
            "-----BEGIN X PRIVATE KEY-----",
        ]:
            for match in rule.pattern.finditer(fake):
                assert any(
                    lit in match.group(0).lower() or lit in fake.lower() for lit in rule.literals
                ), rule.kind


AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize(
    "text, secret",
    [
        ("postgres://app:p@ss/w0rd@db:5432/x", "p@ss/w0rd"),
        ("redis://:s3cr3t-pass@cache:6379/0", "s3cr3t-pass"),
        ("amqp://guest:a/b/c@rabbit/", "a/b/c"),
        ("see https://bob:hunter2@example.com/path?x=1 now", "hunter2"),
    ],
)
def test_url_passwords_with_at_signs_slashes_or_no_username(text, secret):
    out = Redactor().text(text)
    assert secret not in out and "[REDACTED:password]@" in out


def test_the_host_and_path_of_a_url_survive():
    assert (
        Redactor().text("postgres://app:p@ss/w0rd@db:5432/x")
        == "postgres://app:[REDACTED:password]@db:5432/x"
    )


def test_aws_secret_access_keys_but_not_hex_digests():
    r = Redactor()
    assert AWS_SECRET not in r.text(f"aws_secret_access_key = {AWS_SECRET}")
    assert AWS_SECRET not in r.text(f"the AWS key {AWS_SECRET} in prose")
    assert AWS_SECRET not in r.text(f"AKIAIOSFODNN7EXAMPLE {AWS_SECRET}")
    assert AWS_SECRET not in r.text(f"secret: {AWS_SECRET}")
    commit = "3f786850e387550fdab836ed7e6dc881de23001b"  # a git commit: 40 hex characters
    assert r.text(f"commit {commit}") == f"commit {commit}"


@pytest.mark.parametrize(
    "value",
    [
        "Zk8Qm2Lx7Wn4Tv9Rb3Hc6Jp1Fs5Gy8Dk2Qw7Lm3X",  # a base64 id
        "order/Zk8Qm2Lx7Wn4Tv9Rb3Hc6Jp1Fs5Gy8Dk2Qw7Lm3X",  # a path with one
        "https://cdn.example/x.png?sig=Zk8Qm2Lx7Wn4Tv9Rb3Hc6Jp1Fs5Gy8Dk2Qw7Lm3X",
        {"checksum": "Zk8Qm2Lx7Wn4Tv9Rb3Hc6Jp1Fs5Gy8Dk2Qw7Lm3X", "n": 1},
    ],
)
def test_forty_characters_with_no_context_are_data_not_a_secret(value):
    """A 40-character mixed-case run is what hashes, ids, signatures and ciphertext look
    like: with nothing saying it is a secret it comes back as it went in (an SDK item, a
    tool argument replayed after a crash)."""
    assert Redactor().redact(value) == value


@pytest.mark.parametrize(
    "key",
    [
        "db_password",
        "token",
        "private_key",
        "passphrase",
        "aws_secret_access_key",
        "X-Api-Key",
        "apiKey",
        "clientSecret",
        "Authorization",
        "cookie",
    ],
)
def test_values_under_secret_keys_whatever_they_look_like(key):
    r = Redactor()
    out = r.redact({"outer": {key: "plain-value-7", "note": "ok"}, "list": [{key: ["a1", "b2"]}]})
    assert "plain-value-7" not in repr(out) and "a1" not in repr(out)
    assert out["outer"]["note"] == "ok"
    # The same keys in text: JSON, escaped JSON inside a string, key=value, headers.
    for text in [
        f'{{"{key}": "plain-value-7"}}',
        f'{{\\"{key}\\": \\"plain-value-7\\"}}',
        f"{key}=plain-value-7&next=1",
        f"{key}: plain-value-7",
    ]:
        assert "plain-value-7" not in r.text(text), text


def test_counters_named_like_secrets_stay():
    value = {"tokens_in": 5, "max_tokens": 100, "token": 7, "idempotency_key": "s:3"}
    assert Redactor().redact(value) == value
    assert Redactor().text("input_tokens: 120, output tokens: 7") == (
        "input_tokens: 120, output tokens: 7"
    )


def test_authorization_headers_of_every_scheme():
    r = Redactor()
    for header in [
        "Authorization: Basic dXNlcjpodW50ZXIy",
        "authorization=Token abc123def",
        "Proxy-Authorization: Digest username=bob, response=6629fae4",
        "curl -H 'Authorization: Basic dXNlcjpodW50ZXIy' https://x",
    ]:
        out = r.text(header)
        assert "dXNlcjpodW50ZXIy" not in out and "abc123def" not in out, out
        assert "[REDACTED:authorization]" in out
    assert "dXNlcjpodW50ZXIy" not in r.text("sent Basic dXNlcjpodW50ZXIy to the proxy")
    assert r.text("basic instructions follow") == "basic instructions follow"


def test_keys_of_objects_are_redacted_too():
    out = Redactor().redact({FAKES["openai-key"]: 1})
    assert list(out) == ["[REDACTED:openai-key]"]


def test_redacting_twice_changes_nothing():
    r = Redactor(secrets=["my-very-own-key-123"])
    samples = [
        *(f"x {fake} y" for fake in FAKES.values()),
        "postgres://app:p@ss/w0rd@db:5432/x",
        f'{{"db_password": "x", "k": "{AWS_SECRET}"}}',
        "Authorization: Bearer abcdefghijklmnop1234",
        "token=abc; my-very-own-key-123",
    ]
    for sample in samples:
        once = r.text(sample)
        assert r.text(once) == once, sample
    value = {"password": "x", "nested": {"api_key": ["a", "b"]}, "t": samples}
    once = r.redact(value)
    assert r.redact(once) == once


def test_a_key_after_an_escape_sequence_written_out_is_still_found():
    """A repr or escaped JSON writes a newline as backslash and "n": the letter must not
    hide the key after it (a model repeating a dict's repr does this)."""
    redactor = Redactor()
    for kind in ("anthropic-key", "github-token", "slack-token", "stripe-key", "openai-key"):
        for escape in ("\\n", "\\t", "\\r", "\\u00e9"):
            text = f"x{escape}{FAKES[kind]} y"
            assert FAKES[kind] not in redactor.text(text), (kind, escape)
            assert redactor.text(text).startswith(f"x{escape}[REDACTED:")
    aws = "wJ7rXUtnFEMIk9MDENGbPxRfiCYzQ3KEY8pLm2Tq"
    assert redactor.text(f"secret\\n{aws} here") == "secret\\n[REDACTED:aws-secret-key] here"
    # A letter that is part of a word still hides nothing: "banksk-" is not a key's start.
    assert redactor.text(f"bank{FAKES['anthropic-key']}") == f"bank{FAKES['anthropic-key']}"
