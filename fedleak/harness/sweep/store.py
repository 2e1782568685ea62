"""The results store of one sweep run folder: SQLite in WAL mode, one commit per measurement.

Tables::

    points(id TEXT PRIMARY KEY, spec TEXT, label TEXT, position INTEGER,
           status TEXT,            -- pending | running | done | failed
           error TEXT, updated_at REAL)
    measurements(id INTEGER PRIMARY KEY AUTOINCREMENT, point_id TEXT,
                 kind TEXT,        -- attack | utility | audit
                 metrics TEXT, started_at REAL, finished_at REAL, UNIQUE(point_id, kind))
    meta(key TEXT PRIMARY KEY, value TEXT)

A measurement is inserted, and committed, the moment it finishes; nothing is ever updated or
deleted, so a process killed at any instant (SIGKILL included) leaves every finished
measurement intact and :meth:`ResultStore.done` tells a re-run what to skip. The
``UNIQUE(point_id, kind)`` constraint makes a repeated measurement an error rather than a
silent duplicate. Several processes (``--jobs N``) may write at once; each opens its own
connection and waits up to ``timeout`` seconds for the write lock.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedleak.harness.sweep.grid.points import Point
from fedleak.harness.sweep.measure.measurements import (
    AttackMeasurement,
    AuditMeasurement,
    UtilityMeasurement,
)

KINDS = ("attack", "utility", "audit")
STORE_NAME = "results.sqlite"

_MEASUREMENTS = """measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    point_id TEXT NOT NULL REFERENCES points(id),
    kind TEXT NOT NULL CHECK (kind IN ('attack', 'utility', 'audit')),
    metrics TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    UNIQUE (point_id, kind)
)"""
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS points (
    id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    label TEXT NOT NULL,
    position INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    error TEXT,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS {_MEASUREMENTS};
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class DuplicateMeasurement(RuntimeError):
    """A measurement of a (point, kind) the store already holds."""


@dataclass
class Measurement:
    """One finished measurement as stored."""

    id: int
    point_id: str
    kind: str
    metrics: dict[str, Any]
    started_at: float
    finished_at: float


@dataclass
class StoredPoint:
    """A point as stored, with its status."""

    point: Point
    position: int
    status: str
    error: str | None


class ResultStore:
    """The SQLite store at ``path`` (created with its tables if missing)."""

    def __init__(self, path: str | Path, timeout: float = 60.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # autocommit: every statement below is its own transaction, committed on return
        self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        # the tables in one transaction: a reader sees all of them or none
        self._db.executescript(f"BEGIN IMMEDIATE;{_SCHEMA}COMMIT;")
        self._allow_audits()

    def close(self) -> None:
        self._db.close()

    def _allow_audits(self) -> None:
        """Stores written before audits existed allow only attack and utility measurements:
        rebuild their measurements table with the wider CHECK, keeping every row."""
        row = self._db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = "
                               "'measurements'").fetchone()
        if row is None or "'audit'" in row[0]:
            return
        with self._transaction():
            self._db.execute("ALTER TABLE measurements RENAME TO measurements_before_audits")
            self._db.execute(f"CREATE TABLE {_MEASUREMENTS}")
            self._db.execute("INSERT INTO measurements SELECT * FROM "
                             "measurements_before_audits")
            self._db.execute("DROP TABLE measurements_before_audits")

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- points ----------------------------------------------------------------------------

    def add_points(self, points: Iterable[Point]) -> None:
        """Register points (known ones keep their status and measurements)."""
        now = time.time()
        with self._transaction():
            for position, point in enumerate(points):
                self._db.execute(
                    "INSERT INTO points (id, spec, label, position, updated_at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
                    "spec = excluded.spec, label = excluded.label, position = excluded.position",
                    (point.point_id, point.to_json(), point.label, position, now),
                )

    def set_status(self, point_id: str, status: str, error: str | None = None) -> None:
        self._db.execute("UPDATE points SET status = ?, error = ?, updated_at = ? WHERE id = ?",
                         (status, error, time.time(), point_id))

    def release_running(self) -> int:
        """Points left ``running`` by a sweep that stopped before finishing them (interrupted,
        or killed) go back to ``pending``; how many did."""
        cursor = self._db.execute(
            "UPDATE points SET status = 'pending', error = NULL, updated_at = ? "
            "WHERE status = 'running'", (time.time(),))
        return cursor.rowcount

    def points(self) -> list[StoredPoint]:
        rows = self._db.execute(
            "SELECT spec, position, status, error FROM points ORDER BY position, id").fetchall()
        return [StoredPoint(Point.from_json(spec), pos, status, error)
                for spec, pos, status, error in rows]

    # -- measurements ----------------------------------------------------------------------

    def done(self, point_id: str, kind: str) -> bool:
        """Whether ``kind`` has been measured for ``point_id``."""
        row = self._db.execute("SELECT 1 FROM measurements WHERE point_id = ? AND kind = ?",
                               (point_id, kind)).fetchone()
        return row is not None

    def record(self, point_id: str, kind: str, metrics: dict[str, Any],
               started_at: float) -> int:
        """Insert and commit one finished measurement; returns its row id."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        try:
            cursor = self._db.execute(
                "INSERT INTO measurements (point_id, kind, metrics, started_at, finished_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (point_id, kind, json.dumps(metrics, default=str), started_at, time.time()),
            )
        except sqlite3.IntegrityError as err:
            if "UNIQUE" in str(err):
                raise DuplicateMeasurement(f"point {point_id} already has a {kind} "
                                           "measurement") from None
            raise
        return int(cursor.lastrowid or 0)

    def shared_utility(self, point: Point) -> dict[str, Any] | None:
        """A utility measurement of another point with the same :attr:`Point.utility_id`
        (another attack of a portfolio at the same setting), or None."""
        return self._shared(point, "utility", lambda p: p.utility_id)

    def shared_audit(self, point: Point) -> dict[str, Any] | None:
        """An audit measurement of another point with the same :attr:`Point.audit_id`
        (another attack of a portfolio at the same setting), or None."""
        return self._shared(point, "audit", lambda p: p.audit_id)

    def _shared(self, point: Point, kind: str,
                key: Callable[[Point], str]) -> dict[str, Any] | None:
        wanted = key(point)
        for stored in self.points():
            other = stored.point
            if other.point_id != point.point_id and key(other) == wanted \
                    and self.done(other.point_id, kind):
                for m in self.measurements(other.point_id):
                    if m.kind == kind:
                        return m.metrics
        return None

    def measurements(self, point_id: str | None = None) -> list[Measurement]:
        query = ("SELECT id, point_id, kind, metrics, started_at, finished_at FROM measurements")
        args: tuple[Any, ...] = ()
        if point_id is not None:
            query += " WHERE point_id = ?"
            args = (point_id,)
        rows = self._db.execute(query + " ORDER BY id", args).fetchall()
        return [Measurement(i, p, k, json.loads(m), s, f) for i, p, k, m, s, f in rows]

    def finished(self, point_id: str) -> tuple[AttackMeasurement | None,
                                               UtilityMeasurement | None]:
        """The point's attack and utility measurements, typed (None where not measured)."""
        found = {m.kind: m.metrics for m in self.measurements(point_id)}
        attack = AttackMeasurement.from_json(found["attack"]) if "attack" in found else None
        utility = UtilityMeasurement.from_json(found["utility"]) if "utility" in found else None
        return attack, utility

    def audit(self, point_id: str) -> AuditMeasurement | None:
        """The point's audit measurement, typed (None where not measured)."""
        found = {m.kind: m.metrics for m in self.measurements(point_id)}
        return AuditMeasurement.from_json(found["audit"]) if "audit" in found else None

    # -- meta ------------------------------------------------------------------------------

    def set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) "
                         "DO UPDATE SET value = excluded.value", (key, value))

    def meta(self, key: str, default: str | None = None) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on error) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
