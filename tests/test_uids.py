"""Ids unique across logs: every capture and exchange has a UUIDv7 ``uid``, new rows and
rows of logs upgraded from before uids alike."""

from __future__ import annotations

import random
import shutil
import time
import uuid
from pathlib import Path

import sqlite_utils

from tasktape.eventlog import LogWriter, open_db
from tasktape.eventlog.schema import migrations
from tasktape.eventlog.uids import derived_uuid7, uuid7


def _fields(uid: str) -> tuple[int, int, int]:
    """A uid's milliseconds, version and variant."""
    value = uuid.UUID(uid)
    return value.int >> 80, value.version or 0, value.int >> 62 & 0b11


def test_a_uuid7_names_its_moment_and_sorts_by_it() -> None:
    ns = 1_764_000_000_123_456_789
    assert _fields(uuid7(ns)) == (ns // 1_000_000, 7, 0b10)
    # Within one millisecond too: the next 12 bits are its fraction.
    moments = [ns + step for step in (0, 250, 100_000, 999_000, 1_000_000, 86_400 * 10**9)]
    uids = [uuid7(m) for m in moments]
    assert uids == sorted(uids)
    assert len({uuid7(ns) for _ in range(1000)}) == 1000  # the rest is random


def test_uids_sort_as_their_moments_even_with_the_largest_random_bits() -> None:
    ns = 1_764_000_000_000_000_000
    for step in (250, 1_000, 1_000_000):
        assert uuid7(ns, b"\xff" * 8) < uuid7(ns + step, b"\0" * 8), step


def test_a_derived_uid_is_the_same_for_the_same_parts_only() -> None:
    ns = time.time_ns()
    assert derived_uuid7(ns, "exchange", 1, "POST") == derived_uuid7(ns, "exchange", 1, "POST")
    assert derived_uuid7(ns, "exchange", 1, "POST") != derived_uuid7(ns, "exchange", 2, "POST")
    assert _fields(derived_uuid7(ns, "x"))[1:] == (7, 0b10)


def test_every_capture_and_exchange_written_has_its_own_uid(tmp_path: Path) -> None:
    before = time.time_ns()
    with LogWriter(tmp_path / "log.db") as w:
        for _ in range(2):
            cap = w.begin_capture(source="test")
            for n in range(3):
                ex = w.begin_exchange(cap, method="GET", path=f"/{n}", started_ns=time.time_ns())
                w.end_exchange(ex, duration_ns=1)
    db = open_db(tmp_path / "log.db")
    for table, rows in (("captures", 2), ("exchanges", 6)):
        uids = [u for (u,) in db.execute(f"SELECT uid FROM {table} ORDER BY id")]
        assert len(set(uids)) == rows and uids == sorted(uids), table  # sorted as they started
        for uid in uids:
            ms, version, variant = _fields(uid)
            assert (
                version == 7 and variant == 0b10 and before // 1_000_000 <= ms <= time.time_ns() // 1_000_000
            )


OLD_NS = 1_796_033_908_000_000_000  # 2026-11-30T10:18:28Z


def _old_log(path: Path) -> None:
    """A log as tasktape wrote it before uids: two captures, three exchanges."""
    db = sqlite_utils.Database(path)
    migrations.apply(db, stop_before="0011_uids")
    db["captures"].insert_all(
        [
            {"id": 1, "started_at": "2026-11-30T10:18:28.123456Z", "source": "record"},
            {"id": 2, "started_at": "2026-11-30T11:00:00.000000Z", "source": "record"},
        ]
    )
    db["exchanges"].insert_all(
        [
            {
                "id": n,
                "capture_id": 1 + (n > 2),
                "started_ns": 1_796_033_908_000_000_000 + n,
                "method": "POST",
            }
            for n in (1, 2, 3)
        ]
    )
    db.close()


def test_an_upgraded_log_gets_the_same_uids_in_every_copy(tmp_path: Path) -> None:
    _old_log(tmp_path / "a.db")
    shutil.copy(tmp_path / "a.db", tmp_path / "b.db")
    found = []
    for name in ("a.db", "b.db"):
        db = open_db(tmp_path / name)  # upgrades
        found.append(
            [db.execute(f"SELECT uid FROM {t} ORDER BY id").fetchall() for t in ("captures", "exchanges")]
        )
        db.close()
    assert found[0] == found[1]
    captures, exchanges = ([u for (u,) in rows] for rows in found[0])
    assert len(set(captures)) == 2 and len(set(exchanges)) == 3
    # Each names its row's start: the capture's started_at, the exchange's started_ns.
    assert _fields(captures[0])[0] == 1_796_033_908_123 and _fields(exchanges[0])[0] == 1_796_033_908_000


def test_a_uuid7_is_spelled_as_the_uuid_module_spells_it() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        ns, bits = rng.randrange(0, 2**62), rng.randbytes(8)
        uid = uuid7(ns, bits)
        assert uid == str(uuid.UUID(uid)) == str(uuid.UUID(int=uuid.UUID(uid).int))
        assert _fields(uid) == (ns // 1_000_000, 7, 0b10)
