"""How faithful a replay was: for every answer served from a recording, the bytes sent
against the bytes recorded (and why they differ), how late each chunk went out against
its schedule, and the faults it got. A replay server may run for days: it counts every
answer, and keeps in full only the latest, the first that differed, and those under way."""

from __future__ import annotations

import copy
import hashlib
import math
import statistics
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tasktape.eventlog.spans import Chunks

from .kept import Kept, times

# The answers a long-running replay keeps in full (each about a KiB, settled); the others it
# only counts. The latest: enough for a tester polling the report to see what just went out.
RECENT = 100
# The first that differed: where a problem began, what a tester reads, without the report
# growing for ever when every answer differs (an agent card, rewritten each time).
DIFFERED = 500
# The distinct lines an exit summary names, each with its count: a person reads them.
SUMMARY_LINES = 50
# Lateness percentiles are kept as counts per bucket, buckets this much apart (1%), from
# LATE_FLOOR_MS: a day of chunks in some thousand buckets, each percentile within 1%.
LATE_GROWTH = 1.01
LATE_FLOOR_MS = 0.001


class Divergence(StrEnum):
    """Why the bytes sent are not the bytes recorded."""

    FAULT = "fault"  # a fault changed or cut them
    RESUME = "resume"  # the client resumed (Last-Event-ID): it got the rest
    REWRITE = "rewrite"  # the JSON-RPC id, added SSE ids, an agent card pointing here
    SUBSCRIBE = "subscribe"  # a subscription built from the task's events, after its snapshot
    CLIENT_LEFT = "client-left"  # the client went away before the end
    STOPPED = "stopped"  # the replay server was stopped before the end


@dataclass(frozen=True)
class Digest:
    """Bytes as the report compares them: their SHA-256 and how many."""

    sha256: str
    size: int

    @classmethod
    def of(cls, data: bytes) -> Digest:
        return cls(hashlib.sha256(data).hexdigest(), len(data))


@dataclass(frozen=True)
class Ended:
    """What the record of an answer that has ended keeps of its bytes and its timing."""

    recorded: Digest
    sent: Digest
    lateness_ms: dict[str, float]  # p50, p99, max


@dataclass
class Served:
    """One answer as it went out."""

    method: str
    path: str
    exchange: str  # where it was recorded: "captures.db exchange 3", "c.jsonl:2"
    digest: Callable[[], Digest]  # what the recording holds, worked out when it is asked for
    reasons: list[str] = field(default_factory=list)  # "<divergence>: <detail>"
    faults: list[str] = field(default_factory=list)
    late_s: list[float] = field(default_factory=list)  # per chunk: negative is early
    finished: bool = False
    head_edited: bool = False  # its status or Content-Type was not the recording's (a fault)
    # What went out is the start of ``body``'s chunks, ``bytes_sent`` of them: hashed once
    # the answer has ended (``settle``), not per chunk while sending.
    body: Chunks = field(default_factory=list)
    bytes_sent: int = 0
    number: int = 0  # its place among the server's answers, from 1
    ended: Ended | None = None  # once settled

    @property
    def late_ms(self) -> list[float]:
        """Each chunk's lateness in milliseconds, an early one as 0."""
        return [max(0.0, s * 1000) for s in self.late_s]

    def because(self, why: Divergence, detail: str) -> None:
        self.reasons.append(f"{why}: {detail}")

    def settle(self) -> None:
        """The answer has ended: its bytes hashed and its lateness summed up, and what they
        were worked out from let go (the chunks, each chunk's lateness, what the recording's
        digest needed), which a record kept for long would otherwise hold on to."""
        self.ended = self._so_far()
        recorded = self.ended.recorded
        self.digest = lambda: recorded
        self.body, self.late_s = [], []

    def _so_far(self) -> Ended:
        late = sorted(self.late_ms)
        sent = Digest.of(b"".join(data for _, data in self.body)[: self.bytes_sent])
        lateness = {
            "p50": round(statistics.median(late), 3) if late else 0.0,
            "p99": round(late[min(len(late) - 1, int(len(late) * 0.99))], 3) if late else 0.0,
            "max": round(late[-1], 3) if late else 0.0,
        }
        return Ended(self.digest(), sent, lateness)

    def as_json(self) -> dict[str, Any]:
        ended = self.ended or self._so_far()
        recorded, sent = ended.recorded, ended.sent
        return {
            "answer": self.number,
            "method": self.method,
            "path": self.path,
            "exchange": self.exchange,
            # Every byte, and an end as recorded: one a fault or its client broke off after
            # its last byte came without the body's end, which the client saw as an error.
            # A head a fault changed is no recording either, though a HEAD has no bytes.
            "identical": sent == recorded and (self.finished or not self.reasons) and not self.head_edited,
            "sha256_sent": sent.sha256,
            "sha256_recorded": recorded.sha256,
            "bytes_sent": sent.size,
            "bytes_recorded": recorded.size,
            "reasons": list(self.reasons),
            "lateness_ms": dict(ended.lateness_ms),
            "faults": list(self.faults),
            "finished": self.finished,
        }


def kinds(reasons: Iterable[str]) -> set[Divergence]:
    """The kinds of difference that ``reasons`` (each ``"<divergence>: <detail>"``) name."""
    return {Divergence(reason.partition(":")[0]) for reason in reasons}


def summary_line(stream: dict[str, Any]) -> str:
    """How an exit summary names an answer that differed, and why."""
    why = "; ".join(stream["reasons"]) or "the bytes differ"
    return f"{stream['method']} {stream['path']} ({stream['exchange']}): {why}"


@dataclass
class Lateness:
    """How late every chunk went out, in memory that does not grow with their number: a
    count per bucket (``LATE_GROWTH`` apart), and the worst exactly. A percentile is its
    bucket's lower bound: at most 1% under the exact one."""

    buckets: Counter[int] = field(default_factory=Counter)
    chunks: int = 0
    worst: float = 0.0

    def add(self, ms: float) -> None:
        bucket = 0 if ms < LATE_FLOOR_MS else 1 + int(math.log(ms / LATE_FLOOR_MS, LATE_GROWTH))
        self.buckets[bucket] += 1
        self.chunks += 1
        self.worst = max(self.worst, ms)

    def at(self, share: float) -> float:
        """The lateness ``share`` of the chunks were at most (as ``Served.as_json`` ranks)."""
        rank, seen = min(self.chunks - 1, int(self.chunks * share)), 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen > rank:
                low = 0.0 if bucket == 0 else LATE_FLOOR_MS * LATE_GROWTH ** (bucket - 1)
                return min(low, self.worst)
        return self.worst

    def as_json(self) -> dict[str, float]:
        if not self.chunks:
            return {"p50": 0.0, "p99": 0.0, "max": 0.0}
        return {"p50": round(self.at(0.5), 3), "p99": round(self.at(0.99), 3), "max": round(self.worst, 3)}


@dataclass
class Tally:
    """What the report and the exit summary say of all the answers, counted exactly as each
    ends: how many, how many were identical, how many differed for each kind of reason,
    the lateness of their chunks, and the summary's lines (``SUMMARY_LINES`` distinct ones,
    each with its count; the answers that differed otherwise, counted)."""

    answers: int = 0
    identical: int = 0
    reasons: Counter[Divergence] = field(default_factory=Counter)
    lateness: Lateness = field(default_factory=Lateness)
    lines: Kept[str] = field(default_factory=lambda: Kept(str, bound=SUMMARY_LINES))

    def add(self, stream: dict[str, Any], late_ms: list[float]) -> None:
        self.answers += 1
        self.identical += stream["identical"]
        self.reasons.update(kinds(stream["reasons"]))
        for ms in late_ms:
            self.lateness.add(ms)
        if stream["identical"]:
            return
        self.lines.add(summary_line(stream))


class Record:
    """The fidelity record of a replay server's answers: the ``Tally`` of all, and in full
    those under way, the latest ``RECENT`` and the first ``DIFFERED`` that differed; or,
    with ``every_answer`` (a test's server, which lives as long as the test), all of them."""

    def __init__(self, *, every_answer: bool = False) -> None:
        self.tally = Tally()
        self._answers = 0
        self._open: dict[int, Served] = {}  # the answers under way, by number
        self._recent: deque[Served] = deque(maxlen=None if every_answer else RECENT)
        self._differed: list[Served] = []  # (the same objects as in _recent: no copies)

    def opened(self, served: Served) -> None:
        """An answer starts going out."""
        self._answers += 1
        served.number = self._answers
        self._open[served.number] = served

    def closed(self, served: Served) -> None:
        """An answer has ended: counted, settled, and kept in full if it is one to keep."""
        del self._open[served.number]
        late = served.late_ms
        served.settle()
        stream = served.as_json()
        self.tally.add(stream, late)
        self._recent.append(served)
        if not stream["identical"] and len(self._differed) < DIFFERED:
            self._differed.append(served)

    @property
    def kept(self) -> list[Served]:
        """The answers kept in full, in the order they began."""
        kept = {s.number: s for s in [*self._differed, *self._recent, *self._open.values()]}
        return [kept[n] for n in sorted(kept)]

    def totals(self) -> Tally:
        """The tally, with the answers still under way counted as they are so far."""
        if not self._open:
            return self.tally
        tally = copy.deepcopy(self.tally)
        for served in self._open.values():
            tally.add(served.as_json(), served.late_ms)
        return tally

    def report(self) -> dict[str, Any]:
        """The report's JSON: the answers kept in full (``streams``), and what all said."""
        tally, streams = self.totals(), [s.as_json() for s in self.kept]
        return {
            "answers": tally.answers,
            "identical": tally.identical,
            "reasons": dict(tally.reasons),
            "lateness_ms": tally.lateness.as_json(),
            "under_way": len(self._open),
            "omitted": tally.answers - len(streams),
            "streams": streams,
        }


def summary(record: Record) -> list[str]:
    """The fidelity lines of an exit summary: a count, then each way answers differed, with
    how many did (``(x5,000)``)."""
    tally = record.totals()
    if not tally.answers:
        return []
    lines = [
        f"  fidelity: {tally.identical:,} of {tally.answers:,} answers byte-identical, "
        f"latest chunk {tally.lateness.worst:.1f} ms behind schedule"
    ]
    lines += [f"    {line}{times(n)}" for line, n in tally.lines.distinct()]
    return lines + [f"    {rest}" for rest in tally.lines.rest("answer", "that differed otherwise")]
