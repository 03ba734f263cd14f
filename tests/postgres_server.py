"""A throwaway PostgreSQL server for the tests: initdb into a temporary folder, pg_ctl start on a
free loopback port, stopped and removed at the end. The server binaries come from the system
(Debian's `postgresql` package; `.ci/run` installs it where it is missing)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER = "smallinit"  # the database role the tests connect as (trust auth on loopback only)


def find_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return versions[-1] if versions else None


def missing_reason() -> str | None:
    """Why no server can be started here (None when one can)."""
    if not (find_bin("initdb") and find_bin("pg_ctl")):
        return "PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and no 'postgres' user to run the server as (PostgreSQL refuses root)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed: make install EXTRAS=dev,dashboard,postgres"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """`with PostgresServer() as pg: pg.url("optuna")`; databases made with pg.create(name)."""

    def __init__(self):
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="smallinit-pg-"))
        self.data = self.root / "data"
        self._as = []
        if os.geteuid() == 0:  # PostgreSQL will not run as root: run it as the system's postgres user
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, *cmd: str) -> None:
        proc = subprocess.run([*self._as, *cmd], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed: {proc.stderr.strip()[-2000:]}")

    def __enter__(self) -> PostgresServer:
        self._run(find_bin("initdb"), "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8",
                  "--no-sync")
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c max_connections=200"
        self._run(find_bin("pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.root / "server.log"),
                  "-w", "-t", "60", "start")
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._run(find_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def create(self, name: str) -> str:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def url(self, name: str) -> str:
        """The URL a user would give: plain postgresql://, the driver left to the project."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{name}"
