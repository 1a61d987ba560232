from __future__ import annotations

import pytest


@pytest.fixture
def make_saver(transactional_db):
    """RespawnSavers closed after the test (each holds a database connection of its own)."""
    from sessions_app.langgraph.saver import RespawnSaver

    made = []

    def make(**kwargs):
        saver = RespawnSaver(**kwargs)
        made.append(saver)
        return saver

    yield make
    for saver in made:
        saver.close()
