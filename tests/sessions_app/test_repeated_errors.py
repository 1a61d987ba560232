"""The worker's background passes log an outage without flooding the log."""

import logging

from sessions_app.workers import worker
from sessions_app.workers.worker import RepeatedErrors


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "respawn.worker"]


def test_each_distinct_error_of_an_outage_is_logged_once_even_when_they_alternate(caplog):
    caplog.set_level(logging.INFO, logger="respawn.worker")
    errors = RepeatedErrors("reconciler", interval=3600)
    refused, starting = OSError("connection refused"), OSError("the database is starting up")
    for exc in [refused, starting, refused, starting, refused, refused]:
        errors.failed(exc)
    assert _lines(caplog) == [
        "reconciler failed: OSError: connection refused",
        "reconciler failed: OSError: the database is starting up",
    ]
    logged = [r for r in caplog.records if r.name == "respawn.worker"]
    assert all(r.exc_info for r in logged)  # each with its traceback


def test_recovery_ends_the_outage_and_the_next_one_logs_its_errors_again(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="respawn.worker")
    clock = [100.0]
    monkeypatch.setattr(worker.time, "monotonic", lambda: clock[0])
    errors = RepeatedErrors("alert sender", interval=3600)
    errors.succeeded()  # nothing failed: nothing to say
    errors.failed(ValueError("down"))
    clock[0] += 7
    errors.succeeded()
    errors.succeeded()
    errors.failed(ValueError("down"))
    assert _lines(caplog) == [
        "alert sender failed: ValueError: down",
        "alert sender works again (it had failed for 7s)",
        "alert sender failed: ValueError: down",
    ]


def test_repeats_are_summed_up_at_most_once_an_interval(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="respawn.worker")
    clock = [0.0]
    monkeypatch.setattr(worker.time, "monotonic", lambda: clock[0])
    errors = RepeatedErrors("search indexer", interval=60)
    for _ in range(130):  # one pass every second for 130 s
        errors.failed(RuntimeError("refused\nsecond line"))
        clock[0] += 1
    assert _lines(caplog) == [
        "search indexer failed: RuntimeError: refused\nsecond line",
        "search indexer still failing (60 more time(s) in the last 60s): RuntimeError: refused",
        "search indexer still failing (60 more time(s) in the last 60s): RuntimeError: refused",
    ]
