"""A throwaway PgBouncer in front of the test server, for the pooled-DSN tests.

Debian's ``pgbouncer`` binary, started on a free port in transaction mode with a
config of its own in a temporary folder; every database name is passed through
to the server ``target`` names. PgBouncer refuses to run as root: under root it
runs as ``postgres`` (else ``nobody``). No ``ignore_startup_parameters``: a
client that sends startup ``options`` (a ``search_path``) is refused, so a test
through it proves the driver sends none.

    with Bouncer(target_dsn, settings={"server_idle_timeout": "1"}) as bouncer:
        dsn = bouncer.dsn()
        bouncer.restart()
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["Bouncer", "binary"]


def binary() -> str | None:
    """The pgbouncer binary (Debian installs it in /usr/sbin), or None."""
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root with neither a postgres nor a nobody user")


class Bouncer:
    """One PgBouncer: :meth:`start`, :meth:`stop`, :meth:`restart`, :meth:`close`.
    ``settings`` go in its ``[pgbouncer]`` section over the defaults below."""

    def __init__(self, target: str, settings: Mapping[str, str] | None = None) -> None:
        exe = binary()
        if exe is None:
            raise RuntimeError("pgbouncer is not installed")
        self.exe = exe
        params = conninfo_to_dict(target)
        self.user = str(params.get("user") or "postgres")
        self.dbname = str(params.get("dbname") or self.user)
        self.port = _free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="tj-pgbouncer-"))
        self.owner = _run_as()
        host = params.get("host") or "127.0.0.1"
        server = f"host={host} port={params.get('port') or 5432}"
        if params.get("password"):
            server += f" password={params['password']}"
        config = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(self.folder / "users.txt"),
            "pool_mode": "transaction",
            "max_client_conn": "400",
            "default_pool_size": "20",
            "logfile": str(self.folder / "pgbouncer.log"),
            "pidfile": str(self.folder / "pgbouncer.pid"),
            "admin_users": self.user,
            "server_reset_query": "",
            **(settings or {}),
        }
        lines = ["[databases]", f"* = {server}", "", "[pgbouncer]"]
        lines += [f"{k} = {v}" for k, v in config.items()]
        (self.folder / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
        (self.folder / "users.txt").write_text(f'"{self.user}" ""\n')
        if self.owner is not None:
            for path in (self.folder, *self.folder.iterdir()):
                os.chown(path, self.owner.pw_uid, self.owner.pw_gid)
        self.proc: subprocess.Popen[bytes] | None = None

    def dsn(self, **overrides: Any) -> str:
        """A DSN through the pooler (``overrides``: libpq keywords)."""
        params: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": str(self.port),
            "user": self.user,
            "dbname": self.dbname,
            **overrides,
        }
        return make_conninfo("", **params)

    def start(self, timeout: float = 30.0) -> None:
        args = [self.exe, str(self.folder / "pgbouncer.ini")]
        kw: dict[str, Any] = {}
        if self.owner is not None:
            kw = {"user": self.owner.pw_uid, "group": self.owner.pw_gid}
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not start: {self.log()[-2000:]}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop at once (SIGINT: close every connection, client and server)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def admin(self, command: str) -> list[tuple[Any, ...]]:
        """Run ``command`` on the admin console (``SHOW POOLS``, ``RELOAD``)."""
        with psycopg.connect(self.dsn(dbname="pgbouncer"), autocommit=True) as conn:
            cur = conn.execute(command, prepare=False)
            return cur.fetchall() if cur.description else []

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Bouncer:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
