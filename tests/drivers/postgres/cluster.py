"""A throwaway PostgreSQL cluster for tests that need the server itself: its log,
its settings, its restart.

``initdb`` into a fresh temporary folder, started with ``pg_ctl`` on a free port
with ``logging_collector=off`` and ``-l LOGFILE``, so a test reads what the
server logged (``Cluster.log_since``). The binaries are the ones on ``PATH``
(``initdb``, ``pg_ctl``). PostgreSQL refuses to run as root: under root the
cluster belongs to, and runs as, an unprivileged user (``postgres`` when it
exists, else ``nobody``).

    with Cluster(settings={"deadlock_timeout": "100ms"}) as cluster:
        dsn = cluster.dsn()
        mark = cluster.log_mark()
        ...
        assert "deadlock detected" not in cluster.log_since(mark)

``pg_cluster`` in conftest.py is one such cluster per test session.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg

__all__ = ["Cluster", "binaries_missing"]

_BINARIES = ("initdb", "pg_ctl")


def binaries_missing() -> str | None:
    """Why no throwaway cluster can start here (a binary not on PATH), or None."""
    for name in _BINARIES:
        if shutil.which(name) is None:
            return f"{name} is not on PATH"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """One throwaway cluster: :meth:`start`, :meth:`stop`, :meth:`restart`, and
    :meth:`close` (stop and delete its folder). ``settings`` are server settings
    (``-c name=value``) on top of the test defaults (no fsync, trust auth)."""

    def __init__(self, settings: Mapping[str, str] | None = None) -> None:
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "logging_collector": "off",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "100",
            **(settings or {}),
        }
        self.root = Path(tempfile.mkdtemp(prefix="trio-jobs-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.logfile = self.root / "server.log"
        self.port = 0
        self.running = False
        self._user: dict[str, Any] = {}
        if os.geteuid() == 0:
            try:
                entry = pwd.getpwnam("postgres")
            except KeyError:
                entry = pwd.getpwnam("nobody")
            self._user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        try:
            self.socket_dir.mkdir()
            if self._user:
                os.chown(self.socket_dir, self._user["user"], self._user["group"])
            self._run(
                "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync",
                "-E", "UTF8", "--locale=C",
            )  # fmt: skip
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            list(args), capture_output=True, text=True, timeout=60, check=False, **self._user
        )
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        """Start the server, on the port it had before (on a free one the first time)."""
        if self.running:
            return
        tries = 1 if self.port else 5
        for _ in range(tries):
            port = self.port or _free_port()
            options = " ".join(
                [f"-p {port}", f"-k {self.socket_dir}"]
                + [f"-c {k}={v}" for k, v in self.settings.items()]
            )
            try:
                self._run(
                    "pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-o", options,
                    "-w", "-t", "60", "start",
                )  # fmt: skip
            except RuntimeError:
                if tries == 1:
                    raise
                continue  # the port was taken between the probe and the bind
            self.port = port
            self.running = True
            self._wait_ready()
            return
        raise RuntimeError(f"the throwaway cluster did not start; its log:\n{self.log_since(0)}")

    def _wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``mode``: smart, fast or immediate)."""
        if not self.running:
            return
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        self.running = False

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def close(self) -> None:
        """Stop the server and delete its folder."""
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def log_mark(self) -> int:
        """Where the log ends now: pass it to :meth:`log_since`."""
        try:
            return self.logfile.stat().st_size
        except FileNotFoundError:
            return 0

    def log_since(self, mark: int) -> str:
        """What the server logged after ``mark`` (a :meth:`log_mark`)."""
        try:
            with self.logfile.open("rb") as f:
                f.seek(mark)
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
