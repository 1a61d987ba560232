"""The RQ worker class: RQ's forking worker plus the reconciler on a timer.

The reconciler must not depend on Redis holding a scheduled job (Redis may have lost
everything), so every worker process runs it from a thread of its own. Several workers
reconciling at once is safe: each dispatch is a conditional UPDATE that only one wins.
"""

from __future__ import annotations

import logging
import random
import threading

from django.conf import settings
from django.db import connections
from rq import Worker

log = logging.getLogger("respawn.worker")


class Reconciler(threading.Thread):
    def __init__(self, interval: float) -> None:
        super().__init__(name="respawn-reconciler", daemon=True)
        self.interval = interval
        self.stopped = threading.Event()

    def run(self) -> None:
        from .dispatch import reconcile

        # Start soon, then spread the passes of many workers apart.
        delay = min(1.0, self.interval)
        while not self.stopped.wait(delay):
            try:
                reconcile()
            except Exception:
                log.exception("reconciler pass failed")
                connections.close_all()
            delay = self.interval * random.uniform(0.8, 1.2)
        connections.close_all()


class RespawnWorker(Worker):
    def work(self, *args, **kwargs):  # type: ignore[override]
        reconciler = None
        if settings.RESPAWN_RECONCILE_INTERVAL > 0:
            reconciler = Reconciler(settings.RESPAWN_RECONCILE_INTERVAL)
            reconciler.start()
        try:
            return super().work(*args, **kwargs)
        finally:
            if reconciler is not None:
                reconciler.stopped.set()
