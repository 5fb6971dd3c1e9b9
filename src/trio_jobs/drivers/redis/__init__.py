"""The Redis driver: the second durable driver, for apps that already run Redis.

>>> driver = redis_driver("redis://localhost:6379/0")   # no I/O yet
>>> async with open_jobs(driver, jobs=[...]) as jobs: ...  # connects, checks the key schema

Built on coredis (anyio-native: it runs on Trio with no bridge). Every change
that touches more than one key is one Lua script. It ships a fleet-wide lease
store (jobs may declare ``concurrency``) and the operator surface
(``jobs.show``/``list``/``cancel``/..., the CLI and the dashboard: a
``redis://`` URL selects it). What it keeps across a Redis restart is what
Redis keeps: see docs/how-to/redis-driver.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._retention import done_ttl_option
from ..._time import Clock, Duration, parse_duration
from ...errors import ErrorCode, JobsError

if TYPE_CHECKING:
    from ._driver import SCHEMA_VERSION, RedisDriver

__all__ = ["SCHEMA_VERSION", "RedisDriver", "redis_driver"]


def __getattr__(name: str) -> Any:
    # coredis is an extra (`pip install 'trio-jobs[redis]'`): importing trio_jobs
    # must not need it, so the driver module loads on first use.
    if name in ("SCHEMA_VERSION", "RedisDriver"):
        from . import _driver

        return getattr(_driver, name)
    raise AttributeError(name)


def redis_driver(
    url: str | None = None,
    *,
    prefix: str = "trio_jobs",
    clock: Clock | None = None,
    connect_timeout: Duration = "1s",
    stream_timeout: Duration = "10s",
    max_connections: int = 64,
    done_retention: Duration = "14d",
    dead_retention: Duration = "90d",
) -> RedisDriver:
    """The Redis driver. Constructing it does no I/O; ``open()`` connects.

    ``url`` is ``redis://[:password@]host:port/db`` (``rediss://`` for TLS,
    ``unix:///path`` for a socket); ``None`` reads ``REDIS_URL``. Every key
    starts with ``prefix:``, so several apps (or tests) can share one database.
    Opening loads the scripts and checks the key-schema version stored under
    ``prefix:schema`` (a mismatch is ``X_CONFIG_INVALID``). While Redis is down
    a call fails at once with ``X_DRIVER_UNAVAILABLE``: connecting (the TCP
    connect and the handshake) gives up after ``connect_timeout`` ("could not
    connect ... nothing was sent"); a command sent whose reply never comes after
    ``stream_timeout`` ("the outcome is unknown: the command may have landed").
    A settled row is kept
    ``done_retention`` (done) or ``dead_retention`` (dead, failed, cancelled),
    then Redis expires it. ``done_retention=0`` keeps no done rows: the ack
    deletes a job that settles ``done`` with its step records, leases, live
    key and index entries, in the same script call (as the PostgreSQL and
    memory drivers' ``done_retention=0``). The counters still count it;
    ``show`` answers not found. A child (its parent reads its result) and a
    ``unique_for=`` job keep their rows, for 14 days; failed, dead and
    cancelled rows are kept ``dead_retention`` as always. Any value other than
    a duration or 0 is ``X_CONFIG_INVALID``. ``clock`` replaces the server's clock for due times
    and leases: tests only.
    """
    try:
        from ._driver import RedisDriver
    except ImportError:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "the Redis driver needs coredis: pip install 'trio-jobs[redis]'",
        ) from None
    return RedisDriver(
        url,
        prefix=prefix,
        clock=clock,
        connect_timeout=parse_duration(connect_timeout, field="connect_timeout"),
        stream_timeout=parse_duration(stream_timeout, field="stream_timeout"),
        max_connections=max_connections,
        done_retention=done_ttl_option(done_retention, "Redis"),
        dead_retention=parse_duration(dead_retention, field="dead_retention"),
    )
