"""Faults on demand, to test how clients cope: per server (``--fault``) or per request
(the ``X-Tasktape-Fault`` header), written as ``name=value`` items joined by ``;``:

    drop-after=N        close the connection abruptly after the Nth event (or chunk)
    stall=N:MS          stop for MS milliseconds after the Nth event
    status=S            answer status S (with a JSON error) instead of the recording
    delay-headers=MS    send the status and headers MS milliseconds late

A stall or a delay is at most an hour (MAX_MS): a longer one is a typo, not a test.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tasktape.errors import FaultError

HEADER = "X-Tasktape-Fault"
MAX_MS = 3_600_000.0


@dataclass(frozen=True)
class Faults:
    drop_after: int | None = None
    stall_after: int | None = None
    stall_ms: float = 0.0
    status: int | None = None
    delay_headers_ms: float = 0.0

    @classmethod
    def parse(cls, spec: str, base: Faults | None = None) -> Faults:
        """Parse ``spec`` on top of ``base`` (what it names replaces what base says)."""
        faults = base or cls()
        for item in filter(None, (part.strip() for part in spec.replace(",", ";").split(";"))):
            name, sep, value = item.partition("=")
            try:
                if not sep:
                    raise ValueError
                if name == "drop-after":
                    faults = replace(faults, drop_after=_count(value))
                elif name == "stall":
                    after, _, ms = value.partition(":")
                    faults = replace(faults, stall_after=_count(after), stall_ms=_ms(ms))
                elif name == "status":
                    status = int(value)
                    if not 100 <= status <= 599:
                        raise ValueError
                    faults = replace(faults, status=status)
                elif name == "delay-headers":
                    faults = replace(faults, delay_headers_ms=_ms(value))
                else:
                    raise FaultError(
                        f"unknown fault {name!r}; use drop-after=N, stall=N:MS, status=S or delay-headers=MS"
                    )
            except FaultError:
                raise
            except ValueError:
                raise FaultError(
                    f"cannot read the fault {item!r}: see drop-after=N, stall=N:MS, status=S, "
                    "delay-headers=MS"
                ) from None
        return faults

    def __bool__(self) -> bool:
        return self != Faults()


def _count(value: str) -> int:
    n = int(value)
    if n < 0:
        raise ValueError
    return n


def _ms(value: str) -> float:
    ms = float(value)
    if not ms >= 0:  # also refuses NaN
        raise ValueError
    if ms > MAX_MS:
        raise FaultError(f"{value} ms waits too long: stalls and delays are at most {MAX_MS:,.0f} ms")
    return ms
