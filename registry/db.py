"""Engine set-up and migrations.

SQLite gets WAL (readers never block the writer), a busy timeout (writers queue instead of
failing) and foreign keys. Write transactions on SQLite start with ``BEGIN IMMEDIATE`` so two
processes doing read-modify-write never deadlock on a lock upgrade; reads use a plain ``BEGIN``.

Only an engine that may create (``create=True``: `polyspec registry init`, migrations, the commands that
write) switches a file to WAL. An engine opened with ``create=False`` (the router, the dashboard) sets only
per-connection options, which write nothing, and refuses a file without a SQLite header: on an empty file
(a restore that has created its target and not yet written it) the WAL switch would write an empty
database's first page, and landing after the restore's own writes it would erase the restored tables.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.pool import StaticPool

from polyspec.registry.errors import RegistryError, RegistryMissing

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
BUSY_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_S = 10
_WRITE_OPTION = "polyspec_write"
# Any fixed 64-bit key: Postgres serialises concurrent `open_registry` migrations on it.
_PG_MIGRATION_LOCK = 7_316_204_915


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


SQLITE_HEADER_BYTES = 100
MISSING_HINT = "create it with `polyspec registry init` (or `polyspec up`), or point POLYSPEC_REGISTRY_URL at the right one"


def make_engine(url: str, *, create: bool = True) -> Engine:
    """An engine for ``url``; SQLite files get their parent directory created.

    ``create=False`` (the router and its dashboard) opens an existing SQLite file only: a missing one, or one
    without a SQLite header (an empty file), raises `RegistryMissing`, at the engine's creation and at each
    new connection; the file is opened read-write without the create flag, so a file deleted later is never
    silently re-created empty by a reconnect either, and the engine never switches the journal mode.
    """
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError; keep the message short
        raise RegistryError(f"invalid registry URL {url!r}: {exc}") from exc
    if parsed.get_backend_name() != "sqlite":
        # A bounded connect: a registry host that drops packets must not hold a router's worker thread (and
        # its exit) for the kernel's TCP timeout; libpq's default is to wait forever.
        args = {"connect_timeout": CONNECT_TIMEOUT_S} if parsed.get_backend_name() == "postgresql" else {}
        return create_engine(parsed, pool_pre_ping=True, connect_args=args)
    database = parsed.database or ""
    if database in ("", ":memory:"):
        engine = create_engine(parsed, poolclass=StaticPool, connect_args={"check_same_thread": False})
    elif not create and not parsed.query.get("uri"):
        path = Path(database).expanduser()
        check_sqlite_file(path)
        # sqlite3's URI mode=rw: open read-write, never create (a plain path would create it on connect).
        uri = f"file:{quote(str(path.resolve()))}?mode=rw"

        def connect() -> sqlite3.Connection:
            check_sqlite_file(path)  # a reconnect too: the file may have been emptied since
            return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)

        engine = create_engine("sqlite://", creator=connect)
    else:
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
    _configure_sqlite(engine, wal=create)
    return engine


def check_sqlite_file(path: Path) -> None:
    """`RegistryMissing` unless ``path`` is a file that starts with a SQLite header. Reads only.

    The size comes from stat and the header is read by SQLite, never through a descriptor of our own: closing
    one would drop every POSIX lock this process holds on the file, SQLite's included, and another process
    closing its last connection would then delete the WAL under this process's open connections (disk I/O
    errors, then a malformed database). SQLite keeps such descriptors open while its locks need them."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise RegistryMissing(f"registry database {path} does not exist; {MISSING_HINT}") from None
    if path.is_dir():
        raise RegistryMissing(f"registry database {path} is a directory; {MISSING_HINT}")
    if size >= SQLITE_HEADER_BYTES and _has_sqlite_header(path):
        return
    if size == 0:
        what = "is empty (0 bytes)"
    elif size < SQLITE_HEADER_BYTES:
        what = f"is too short for a SQLite database ({size} bytes)"
    else:
        what = "is not a SQLite database (no SQLite header)"
    raise RegistryMissing(
        f"registry database {path} {what}: not opened, and left as it is (a copy still being written, or the "
        "wrong file). Restore a registry by copying it to a temporary name beside it and renaming that into "
        f"place (docs/operations.md); or {MISSING_HINT}")


def _has_sqlite_header(path: Path) -> bool:
    """Whether SQLite reads ``path`` as a database (its header), opened read-write without create, reading only."""
    conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=rw", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        conn.execute("PRAGMA schema_version").fetchone()
        return True
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc):
            return False
        raise
    finally:
        conn.close()


def _configure_sqlite(engine: Engine, *, wal: bool = True) -> None:
    """Connection options; ``wal``: also switch the file to WAL, a write (engines that may create only)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:  # noqa: ANN001 (DB-API types)
        # pysqlite's own BEGIN handling is disabled so that the "begin" hook decides the mode.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if wal:
            cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(_WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def write_engine(engine: Engine) -> Engine:
    """The same pool, but transactions take the write lock up front (SQLite)."""
    return engine.execution_options(**{_WRITE_OPTION: True})


def alembic_config(connection: Connection | None = None, url: str | None = None):  # -> alembic.config.Config
    """An Alembic Config built in code, independent of the current directory."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "registry/migrations has no revisions"
    return head


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine) -> None:
    """Bring the database to the head revision (no-op when it is already there)."""
    head = head_revision()
    with engine.connect() as conn:
        if current_revision(conn) == head:
            return
    with write_engine(engine).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        if current_revision(conn) == head:  # another process migrated while we waited for the lock
            return
        command.upgrade(alembic_config(conn), "head")
