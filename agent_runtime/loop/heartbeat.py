"""The lease heartbeat, and the fence a tool's own writes go through."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from ..store import Lease, LeaseLost, SessionStore
from ..tools import FenceGuard

log = logging.getLogger("respawn.loop")


class Heartbeat:
    """Keeps the lease alive from a background thread while a model call or tool runs, and
    knows, by this worker's own clock, until when the lease is surely still the run's.

    `since` is the monotonic time just before the lease was taken or last renewed: the
    lease runs out no earlier than `since + ttl` wherever it is looked at (clocks in sync
    to well under the TTL, as the lease protocol already requires)."""

    def __init__(
        self,
        store: SessionStore,
        lease: Lease,
        ttl: float,
        interval: float,
        since: float | None = None,
    ) -> None:
        self._store = store
        self._lease = lease
        self._ttl = ttl
        self._interval = interval
        self._stop = threading.Event()
        self.lost = threading.Event()
        self.cancel_requested = False
        self.valid_until = (time.monotonic() if since is None else since) + ttl
        self._thread = threading.Thread(target=self._run, name="respawn-heartbeat", daemon=True)

    def ensure(self) -> None:
        """Raise LeaseLost unless the run still holds its lease: before a tool call
        starts, so that a worker that froze past its lease (a stopped process, a long
        pause) never starts one after another worker may have taken the session over.
        Past the expiry by this clock, or close to it, the lease is renewed first (it
        is still the run's if nobody took it: the token decides)."""
        if self.lost.is_set():
            raise LeaseLost(f"session {self._lease.session_id}: the lease was fenced off")
        if time.monotonic() < self.valid_until - self._ttl / 10:
            return
        sent = time.monotonic()
        try:
            result = self._store.heartbeat(self._lease, self._ttl)
        except Exception as exc:
            raise LeaseLost(
                f"session {self._lease.session_id}: the lease ran out by this worker's clock "
                f"and could not be renewed ({type(exc).__name__}: {exc})"
            ) from exc
        if not result.alive:
            self.lost.set()
            raise LeaseLost(
                f"session {self._lease.session_id}: the lease ran out by this worker's clock "
                "and another holder has it"
            )
        self.valid_until = sent + self._ttl

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval + 5)

    def _run(self) -> None:
        cleanup = getattr(self._store, "thread_cleanup", None)
        last_error, last_logged = "", 0.0
        try:
            while not self._stop.wait(self._interval):
                sent = time.monotonic()
                try:
                    result = self._store.heartbeat(self._lease, self._ttl)
                except Exception as exc:  # retried; the lease TTL is the bound
                    # The same error again (the database down) is logged once a minute.
                    error = f"{type(exc).__name__}: {exc}"
                    if error != last_error or sent - last_logged >= 60:
                        log.warning("heartbeat for %s failed: %s", self._lease.session_id, error)
                        last_error, last_logged = error, sent
                    continue
                last_error = ""
                self.cancel_requested = result.cancel_requested
                if not result.alive:
                    self.lost.set()
                    return
                self.valid_until = sent + self._ttl
        finally:
            if cleanup is not None:
                cleanup()


def fence_guard(store: SessionStore, lease: Lease, heartbeat: Heartbeat | None) -> FenceGuard:
    """What a tool's `ctx.fenced()` enters: the lease checked by this worker's clock (and
    renewed if need be), then the store's own fence (SessionStore.fenced) around the
    tool's writes."""
    fenced = getattr(store, "fenced", None)

    @contextlib.contextmanager
    def guard():
        if heartbeat is not None:
            heartbeat.ensure()
        if fenced is None:
            yield
            return
        with fenced(lease):
            yield

    return guard


def came_back(store: SessionStore, lease: Lease) -> None:
    """After this run found its lease taken: it is alive, so the takeover that counted it
    as a crash (a worker that died) takes that count back. Poison detection then counts
    only runs that never came back. Best effort: the database may be what failed."""
    try:
        if store.came_back(lease):
            log.info(
                "session %s: this run was alive when its lease was taken over; "
                "not counted as a crash",
                lease.session_id,
            )
    except Exception as exc:
        log.warning("session %s: could not take back a crash count: %s", lease.session_id, exc)
