"""How faithful a replay was: for every answer served from a recording, the bytes sent
against the bytes recorded (and why they differ), how late each chunk went out against
its schedule, and the faults it got."""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tasktape.eventlog.spans import Chunks


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
    # What went out is the start of ``body``'s chunks, ``bytes_sent`` of them: hashed when
    # asked for, not per chunk while sending.
    body: Chunks = field(default_factory=list)
    bytes_sent: int = 0

    def because(self, why: Divergence, detail: str) -> None:
        self.reasons.append(f"{why}: {detail}")

    @property
    def sent(self) -> Digest:
        return Digest.of(b"".join(data for _, data in self.body)[: self.bytes_sent])

    def as_json(self) -> dict[str, Any]:
        late = sorted(max(0.0, s * 1000) for s in self.late_s)
        recorded, sent = self.digest(), self.sent
        return {
            "method": self.method,
            "path": self.path,
            "exchange": self.exchange,
            # Every byte, and an end as recorded: one a fault or its client broke off after
            # its last byte came without the body's end, which the client saw as an error.
            "identical": sent == recorded and (self.finished or not self.reasons),
            "sha256_sent": sent.sha256,
            "sha256_recorded": recorded.sha256,
            "bytes_sent": sent.size,
            "bytes_recorded": recorded.size,
            "reasons": list(self.reasons),
            "lateness_ms": {
                "p50": round(statistics.median(late), 3) if late else 0.0,
                "p99": round(late[min(len(late) - 1, int(len(late) * 0.99))], 3) if late else 0.0,
                "max": round(late[-1], 3) if late else 0.0,
            },
            "faults": list(self.faults),
            "finished": self.finished,
        }


def report(served: list[Served]) -> dict[str, Any]:
    return {"streams": [s.as_json() for s in served]}


def summary(served: list[Served]) -> list[str]:
    """The fidelity lines of an exit summary: a count, then each answer that differed."""
    if not served:
        return []
    streams = [s.as_json() for s in served]
    differ = [s for s in streams if not s["identical"]]
    worst = max(s["lateness_ms"]["max"] for s in streams)
    lines = [
        f"  fidelity: {len(streams) - len(differ)} of {len(streams)} answers byte-identical, "
        f"latest chunk {worst:.1f} ms behind schedule"
    ]
    for s in differ:
        why = "; ".join(s["reasons"]) or "the bytes differ"
        lines.append(f"    {s['method']} {s['path']} ({s['exchange']}): {why}")
    return lines
