"""A host clock that is off, for the fleet soak's skewed workers (bench/fleet.py puts this
directory on PYTHONPATH with RESPAWN_FLEET_SKEW=<seconds>): Python's wall clock
(`time.time`, `datetime.now`, `utcnow`, hence Django's `timezone.now()` and RQ's stamps)
runs that many seconds ahead (or behind, negative); the monotonic clock stays true. Used
instead of libfaketime, which breaks Python's timed waits (Event.wait, sleep) here."""

import datetime as _datetime
import os
import time as _time

_offset = float(os.environ.get("RESPAWN_FLEET_SKEW") or 0)

if _offset:
    _real_time, _real_time_ns = _time.time, _time.time_ns
    _time.time = lambda: _real_time() + _offset
    _time.time_ns = lambda: _real_time_ns() + int(_offset * 1e9)
    _shift = _datetime.timedelta(seconds=_offset)

    class _SkewedDatetime(_datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return super().now(tz) + _shift

        @classmethod
        def utcnow(cls):
            return super().now(_datetime.UTC).replace(tzinfo=None) + _shift

    _datetime.datetime = _SkewedDatetime
