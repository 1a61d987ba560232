from __future__ import annotations

import pytest

from ..stubs.sdk_model import sdk_model  # noqa: F401


@pytest.fixture
def make_session(transactional_db):
    """RespawnSessions closed after the test (each keeps a connection on its own thread)."""
    from sessions_app.openai_agents.session import RespawnSession

    made = []

    def make(session_id: str, **kwargs):
        session = RespawnSession(session_id, **kwargs)
        made.append(session)
        return session

    yield make
    for session in made:
        session.close()
