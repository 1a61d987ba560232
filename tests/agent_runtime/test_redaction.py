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
}


@pytest.mark.parametrize("kind", sorted(FAKES))
def test_known_key_shapes_are_replaced(kind):
    text = f"here it is: {FAKES[kind]} (keep it safe)"
    out = Redactor().text(text)
    assert FAKES[kind] not in out
    assert "[REDACTED:" in out and out.startswith("here it is: ") and out.endswith("(keep it safe)")


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
    import re

    from agent_runtime import redaction

    class Unfiltered(Redactor):
        def text(self, value: str) -> str:
            value = redaction.URL_PASSWORD.sub(
                lambda m: m.group("head") + redaction.MARKER.format(kind="password"), value
            )
            for kind, pattern, _ in self._patterns:
                value = pattern.sub(redaction.MARKER.format(kind=kind), value)
            return value

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
    # Every built-in pattern names a literal that each of its matches contains.
    for kind, pattern, literals in redaction.PATTERNS:
        for fake in [
            *FAKES.values(),
            "Bearer abcdefghijklmnop1234",
            "-----BEGIN X PRIVATE KEY-----",
        ]:
            for match in re.finditer(pattern, fake):
                assert any(
                    lit in match.group(0).lower() or lit in fake.lower() for lit in literals
                ), kind
