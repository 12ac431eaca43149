"""Where the router gets deployments and shares live stats: the `TableSource` protocol, and the registry as the
production source (`RegistrySource`), watched for a SQLite file deleted or replaced under it (`RegistryFile`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.engine import make_url

from polyspec.router.table import LiveRow, live_row_dict, to_live_row


class TableSource(Protocol):
    """Where the router gets deployments and shares live stats (the registry in production)."""

    def deployments(self) -> Sequence[Any]: ...

    def live_stats(self) -> Sequence[LiveRow]: ...

    def record_live_stats(self, router_id: str, rows: Sequence[LiveRow]) -> None: ...


class RegistrySource:
    """The production source: ``registry.open_registry(url, create=False)``; opened lazily, reopened after errors.

    The router never creates a registry: a missing one raises `RegistryMissing` (the router then keeps its
    last table and reports it) until `polyspec registry init` or `polyspec up` makes one. A SQLite file is
    also watched by identity: an open connection goes on reading, and writing, a file that was deleted or
    replaced. So once opened, a missing file is `RegistryMissing` too (never re-created empty) and a
    replaced one (a restored backup) is reopened.

    The refresh and the stats flush call it from two worker threads: opening and dropping are serialised.
    """

    def __init__(self, url: str | None = None) -> None:
        self._url = url
        self._registry: Any = None
        self._file: RegistryFile | None = None
        self._lock = threading.Lock()
        # Calls in flight per open registry. A registry dropped while the other thread still runs a query on
        # it is closed by the last call to finish, never under it: closing a SQLite connection in use from
        # another thread crashed the process (a segfault in the CI replica of 2026-12-03, registry locked).
        self._users: dict[int, int] = {}
        self._retired: dict[int, Any] = {}

    def _reg(self) -> Any:
        """The open registry, counted as in use until `_release` (opened on first use)."""
        with self._lock:
            registry = self._reg_locked()
            self._users[id(registry)] = self._users.get(id(registry), 0) + 1
            return registry

    def _release(self, registry: Any) -> None:
        with self._lock:
            left = self._users.pop(id(registry)) - 1
            if left:
                self._users[id(registry)] = left
                return
            retired = self._retired.pop(id(registry), None)
        if retired is not None:
            with contextlib.suppress(Exception):
                retired.close()

    def _reg_locked(self) -> Any:
        """The open registry, opening it when needed; the caller holds ``self._lock``."""
        if self._file is not None:
            status = self._file.status()
            if status == "missing":
                self._drop_locked()
                from polyspec.registry import RegistryMissing

                raise RegistryMissing(f"registry database {self._file.path} is missing (deleted or moved); "
                                      "restore it, or create one with `polyspec registry init`")
            if status == "replaced":
                self._drop_locked()  # e.g. restored from a backup: read the new file
        if self._registry is None:
            from polyspec.registry import open_registry

            self._registry = open_registry(self._url, create=False)
            self._file = RegistryFile.of(self._url)
        return self._registry

    def _drop_locked(self) -> None:
        # ``_file`` stays: a deleted file keeps being reported as deleted, a restored one is reopened.
        registry, self._registry = self._registry, None
        if registry is None:
            return
        if self._users.get(id(registry)):
            self._retired[id(registry)] = registry  # closed by its last call (`_release`)
            return
        with contextlib.suppress(Exception):
            registry.close()

    def _call(self, method: str, *args: Any) -> Any:
        registry = self._reg()
        try:
            return getattr(registry, method)(*args)
        except Exception:
            with self._lock:
                if self._registry is registry:
                    self._drop_locked()  # reconnect next time (e.g. Postgres restarted)
            raise
        finally:
            self._release(registry)

    def deployments(self) -> Sequence[Any]:
        return self._call("active_deployments")

    def live_stats(self) -> Sequence[LiveRow]:
        return [to_live_row(row) for row in self._call("live_stats")]

    def record_live_stats(self, router_id: str, rows: Sequence[LiveRow]) -> None:
        self._call("record_live_stats", router_id, [live_row_dict(r) for r in rows])


def _sqlite_path(url: str | None) -> Path | None:
    """The SQLite file behind a registry URL, None for anything else. Read from the URL, not from the
    opened engine: a registry opened without create connects through a ``file:...?mode=rw`` URI."""
    if url is None:
        from polyspec.core.settings import get_settings

        url = get_settings().resolved_registry_url
    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:") or parsed.query.get("uri"):
        return None  # a "file:...?uri=true" name is not a path: not watched
    return Path(database).expanduser()


@dataclass(frozen=True)
class RegistryFile:
    """The SQLite file behind a registry URL, as it was when the registry was opened: an open connection
    goes on reading (and writing) a file that was deleted or replaced, so readers check it before reading."""

    path: Path
    identity: tuple[int, int]  # (st_dev, st_ino)

    @classmethod
    def of(cls, url: str | None) -> RegistryFile | None:
        """None for a registry that is not a SQLite file path, or whose file cannot be read now."""
        path = _sqlite_path(url)
        if path is None:
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        return cls(path, (st.st_dev, st.st_ino))

    def status(self) -> str:
        """"same", "missing" (deleted or moved) or "replaced" (another file at the path, e.g. a restored
        backup). Another error of the file system is raised."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return "missing"
        return "same" if (st.st_dev, st.st_ino) == self.identity else "replaced"
