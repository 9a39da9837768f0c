"""The MLflow store a study is tracked in (``--tracking-uri``), checked before mlflow opens it.

mlflow given an unusable store fails late and in its own words (a text file or ``/dev/null`` as SQLite:
a DatabaseError; a folder: retries for a minute; ``/proc/self/mem``: 107 s; a closed HTTP port: four
minutes of retries), writes where the user did not ask (through a dangling link, to the link's target;
the artifacts of a store outside the study to ``./mlruns``) or keeps nothing (``sqlite://``,
``sqlite:///:memory:``). So the URI is checked first, in milliseconds or within ``CONNECT_TIMEOUT``
seconds: a scheme mlflow stores runs in (SQLite, PostgreSQL, MySQL, an MLflow server over HTTP(S)); a
SQLite path that is a regular SQLite (or empty) file, or absent in an existing folder - never a link,
never under /proc, /dev or /sys; a server or database that accepts a TCP connection in time. Each
refusal is a ConfigError (E981) saying why.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from urllib.parse import urlsplit

from pedsl.errors import ConfigError, quoted

CONNECT_TIMEOUT = 3.0  # seconds a tracking server or database has to accept a connection
SQLITE_MAGIC = b"SQLite format 3\x00"
NETWORK = {"http": 80, "https": 443, "postgresql": 5432, "mysql": 3306}  # scheme: default port
SYSTEM = ("/proc", "/dev", "/sys")
HINT = ("give --tracking-uri sqlite:///PATH.db (a new or SQLite file), http://HOST:PORT (an mlflow server), or "
        "postgresql://... / mysql://...; leave it out for DIR/mlflow.db in the study folder")


def check_store(uri: str, timeout: float = CONNECT_TIMEOUT) -> str:
    """``uri`` when mlflow can keep the study's record there; ConfigError (E981) otherwise."""
    if not uri.strip():
        raise _refused(uri, "it is empty: mlflow would fall back to a store of its own choosing")
    try:
        parts = urlsplit(uri)
        scheme = parts.scheme.lower().split("+")[0]  # postgresql+psycopg2 -> postgresql
        port = parts.port
    except ValueError as exc:
        raise _refused(uri, f"it is not a URI ({exc})") from None
    if scheme == "sqlite":
        _check_sqlite(uri)
        return uri
    if scheme not in NETWORK:
        raise _refused(uri, f"mlflow keeps no study record in {quoted(parts.scheme or 'a bare path')} stores")
    if not parts.hostname:
        raise _refused(uri, "it names no host")
    _probe(uri, parts.hostname, port or NETWORK[scheme], timeout)
    return uri


def is_local_database(uri: str) -> bool:
    """Whether mlflow's artifacts for this store would default to ``./mlruns`` (a database store)."""
    return urlsplit(uri).scheme.lower().split("+")[0] in ("sqlite", "postgresql", "mysql")


def _check_sqlite(uri: str) -> None:
    if not uri.lower().startswith("sqlite:///"):
        raise _refused(uri, "it names no file (sqlite:// is a database in memory: the record would be lost)")
    raw = uri[len("sqlite:///"):].split("?", 1)[0]
    if raw in ("", ":memory:") or raw.startswith("file::memory:"):
        raise _refused(uri, "it is a database in memory: the record would be lost when the study ends")
    path = Path(os.path.abspath(raw if raw.startswith("/") else raw))
    if any(str(path) == d or str(path).startswith(d + "/") for d in SYSTEM):
        raise _refused(uri, f"{path} is a system file, not a store")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not path.parent.is_dir():
            raise _refused(uri, f"its folder {path.parent} does not exist") from None
        return
    except OSError as exc:
        raise _refused(uri, f"{path} cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISLNK(st.st_mode):
        raise _refused(uri, f"{path} is a symbolic link (to {os.readlink(path)}): pedsl never writes through one")
    if not stat.S_ISREG(st.st_mode):
        raise _refused(uri, f"{path} is " + ("a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"))
    if st.st_size:
        try:
            with open(path, "rb") as f:
                head = f.read(len(SQLITE_MAGIC))
        except OSError as exc:
            raise _refused(uri, f"{path} cannot be read ({exc.strerror or exc})") from None
        if head != SQLITE_MAGIC:
            raise _refused(uri, f"{path} is a file but not an SQLite database: mlflow would fail on it (left as it is)")


def _probe(uri: str, host: str, port: int, timeout: float) -> None:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except socket.gaierror:
        raise _refused(uri, f"the host {quoted(host)} does not resolve") from None
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__).lower()
        raise _refused(uri, f"nothing accepts a connection at {host}:{port} within {timeout:g} s ({why})") from None


def _refused(uri: str, why: str) -> ConfigError:
    return ConfigError(f"--tracking-uri {quoted(uri)} cannot hold the study's record: {why}", code="E981", hint=HINT)


__all__ = ["CONNECT_TIMEOUT", "check_store", "is_local_database"]
