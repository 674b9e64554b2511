"""The fault catalogue: what can go wrong on the wire, on demand, to test how clients cope.

A spec is ``name=value`` items joined by ``;``: faults, and the scope they apply in.

    drop-after=N        after event N, the connection closes (FIN) without ending the body
    cut-frame=N         the connection closes in the middle of event N's bytes
    reset-after=N       exactly N events are delivered, then a TCP RST (not a FIN)
    duplicate=N         event N comes twice
    skip=N              event N never comes
    swap=N              events N and N+1 change places
    corrupt=N           event N's data loses its last character, so it no longer parses
    stall=N:MS          the stream stops for MS milliseconds after event N
    drip=BYTES_PER_S    the body trickles out at that rate
    status=S            status S (with a JSON error) instead of the recording
    delay-headers=MS    the status and headers go out MS milliseconds late
    content-type=TYPE   the answer's Content-Type is TYPE
    no-final            the stream's closing event (its protocol says which) never comes

    times=K             only the first K requests the fault applies to (times=1: once)
    every=K             only every Kth request it could apply to
    p=P;seed=S          each request with probability P (a seed makes the run repeatable)
    path=GLOB           only requests whose path matches GLOB (``*`` matches ``/`` too)

Faults that act on events (all but drip, status, delay-headers and content-type) apply to
streams only, so agent cards and other plain answers neither get nor count for them.
A stall or a delay is at most an hour (MAX_MS): a longer one is a typo, not a test.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from tasktape.errors import FaultError
from tasktape.eventlog.http_fields import field_problem

HEADER = "X-Tasktape-Fault"
MAX_MS = 3_600_000.0


class FaultName(StrEnum):
    DROP_AFTER = "drop-after"
    CUT_FRAME = "cut-frame"
    RESET_AFTER = "reset-after"
    DUPLICATE = "duplicate"
    SKIP = "skip"
    SWAP = "swap"
    CORRUPT = "corrupt"
    STALL = "stall"
    DRIP = "drip"
    STATUS = "status"
    DELAY_HEADERS = "delay-headers"
    CONTENT_TYPE = "content-type"
    NO_FINAL = "no-final"


class ScopeName(StrEnum):
    TIMES = "times"
    EVERY = "every"
    P = "p"
    SEED = "seed"
    PATH = "path"


# Each fault's field in Faults, in catalogue order.
FIELDS = {
    FaultName.DROP_AFTER: "drop_after",
    FaultName.CUT_FRAME: "cut_frame",
    FaultName.RESET_AFTER: "reset_after",
    FaultName.DUPLICATE: "duplicate",
    FaultName.SKIP: "skip",
    FaultName.SWAP: "swap",
    FaultName.CORRUPT: "corrupt",
    FaultName.STALL: "stall_after",
    FaultName.DRIP: "drip",
    FaultName.STATUS: "status",
    FaultName.DELAY_HEADERS: "delay_headers_ms",
    FaultName.CONTENT_TYPE: "content_type",
    FaultName.NO_FINAL: "no_final",
}
# The faults written name=N, N an event.
AT_EVENT = frozenset(
    {
        FaultName.DROP_AFTER,
        FaultName.CUT_FRAME,
        FaultName.RESET_AFTER,
        FaultName.DUPLICATE,
        FaultName.SKIP,
        FaultName.SWAP,
        FaultName.CORRUPT,
    }
)
# The faults that change a whole answer, not its events: they apply to any answer.
ANSWER_FAULTS = frozenset({FaultName.DRIP, FaultName.STATUS, FaultName.DELAY_HEADERS, FaultName.CONTENT_TYPE})
# The faults on an answer's head: all a status fault's answer takes, and all a HEAD can get.
HEAD_FAULTS = frozenset({FaultName.STATUS, FaultName.DELAY_HEADERS, FaultName.CONTENT_TYPE})
# Faults that edit events: one event takes one of them at most.
EDITS = (FaultName.SKIP, FaultName.DUPLICATE, FaultName.SWAP, FaultName.CORRUPT)
# Faults that end the connection at an event: a spec names one of them at most.
BREAKS = (FaultName.DROP_AFTER, FaultName.CUT_FRAME, FaultName.RESET_AFTER)
FORMS = (
    "drop-after=N, cut-frame=N, reset-after=N, duplicate=N, skip=N, swap=N, corrupt=N, stall=N:MS, "
    "drip=BYTES_PER_S, status=S, delay-headers=MS, content-type=TYPE, no-final; scope: times=K, "
    "every=K, p=P, seed=S, path=GLOB"
)


@dataclass(frozen=True)
class Scope:
    """Which requests a spec's faults apply to."""

    times: int | None = None
    every: int | None = None
    p: float | None = None
    seed: int | None = None
    path: str | None = None

    @property
    def counts(self) -> bool:
        """Whether it counts requests (so it means something only where requests are counted)."""
        return self.times is not None or self.every is not None


@dataclass(frozen=True)
class Faults:
    """One spec: its faults (None: not asked for) and its scope."""

    drop_after: int | None = None
    cut_frame: int | None = None
    reset_after: int | None = None
    duplicate: int | None = None
    skip: int | None = None
    swap: int | None = None
    corrupt: int | None = None
    stall_after: int | None = None
    stall_ms: float = 0.0
    drip: float | None = None  # bytes per second
    status: int | None = None
    delay_headers_ms: float = 0.0
    content_type: str | None = None
    no_final: bool = False
    scope: Scope = field(default_factory=Scope)

    @classmethod
    def parse(cls, spec: str) -> Faults:
        """Parse ``spec``: items joined by ``;`` (``content-type=`` takes the rest of it,
        parameters and all)."""
        if not isinstance(spec, str):  # (None too: no spec is no fault spec, not an empty one)
            raise FaultError(f"a fault spec is text such as 'drop-after=3', not {type(spec).__name__}")
        faults = cls()
        rest = spec
        given: set[str] = set()  # a name given twice would have its last value win, unsaid
        while rest:
            item, _, rest = rest.partition(";")
            item = item.strip()
            if item.partition("=")[0].strip() == FaultName.CONTENT_TYPE and rest:
                item, rest = f"{item};{rest}", ""
            if not item:
                continue
            name, sep, value = item.partition("=")
            if name.strip() in given:
                raise FaultError(f"{name.strip()} is given twice in {spec!r}: give it once")
            given.add(name.strip())
            try:
                faults = _item(faults, name.strip(), value.strip(), bool(sep))
            except FaultError:
                raise
            except ValueError:
                raise FaultError(f"cannot read the fault {item!r}: {_wanted(name.strip())}") from None
        if not faults.named():
            # (";" too: "$A;$B" with both unset would arm nothing, unsaid)
            scoped = " says where a fault applies but" if faults.scope != Scope() else ""
            raise FaultError(f"{spec!r}{scoped} names no fault: see {FORMS}")
        breaks = [n for n in faults.named() if n in BREAKS]
        if len(breaks) > 1:
            raise FaultError(f"{' and '.join(breaks)} both end the connection: give one of them")
        touched: dict[int, FaultName] = {}
        for event, name in faults.edited_events():
            if event in touched:
                both = f"{touched[event]} and {name} both change event {event}"
                raise FaultError(f"{both}: give one of them")
            touched[event] = name
        return faults

    @classmethod
    def checked(cls, faults: Faults | str) -> Faults:
        """Faults as the replay server takes them: a spec, parsed; or ``Faults`` built by
        hand, checked as a spec's items are (a negative event, a NaN stall, a status of
        99, a content type with a line break are a ``FaultError`` here, not a 500 or a
        client waiting for ever on the first request)."""
        if isinstance(faults, str):
            return cls.parse(faults)
        if not isinstance(faults, Faults):
            raise FaultError(
                f"faults are a spec such as 'drop-after=3' or Faults, not {type(faults).__name__}"
            )
        if type(faults.no_final) is not bool:
            raise FaultError(f"no_final is True or False, not {faults.no_final!r}")
        # Written out exactly (floats as repr), scope first: content-type takes the rest.
        spec = ";".join(
            faults.scope_items(exact=True) + sorted(faults.fault_items(exact=True), key=_last_if_type)
        )
        if cls.parse(spec) != faults:
            raise FaultError(
                f"{faults!r} is not what the spec {spec!r} reads as: give each value as a spec does"
            )
        return faults

    def named(self) -> list[FaultName]:
        """The faults this spec asks for, in catalogue order."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return [name for name, attr in FIELDS.items() if getattr(self, attr) != defaults[attr]]

    def edited_events(self) -> list[tuple[int, FaultName]]:
        """The events its edits change (swap=N changes N and N+1), each with the fault."""
        edited = []
        for name in EDITS:
            n = self.value(name)
            edited += (
                [] if n is None else [(n, name), (n + 1, name)] if name is FaultName.SWAP else [(n, name)]
            )
        return edited

    def value(self, name: FaultName) -> Any:
        """What the spec gives ``name``: an event number, a rate, a status, a type."""
        return getattr(self, FIELDS[name])

    @property
    def on_streams(self) -> bool:
        """Whether it acts on events, so only streams get it (and count for its scope)."""
        return any(n not in ANSWER_FAULTS for n in self.named())

    def fault_items(self, exact: bool = False) -> list[str]:
        """Its faults written out, as a report shows those made (``exact``: every value as
        it is, not rounded for reading)."""
        return self.items(exact)[: len(self.named())]

    def scope_items(self, exact: bool = False) -> list[str]:
        return self.items(exact)[len(self.named()) :]

    def status_items(self) -> list[str]:
        """What a status fault makes, written out: the status, when its headers go out,
        their type (the answer's other faults need the recorded answer)."""
        made = zip(self.fault_items(), self.named(), strict=True)
        return [item for item, name in made if name in HEAD_FAULTS]

    def items(self, exact: bool = False) -> list[str]:
        """The spec written out again, faults then scope: what a report shows (numbers
        rounded for reading, unless ``exact``)."""
        number = repr if exact else "{:g}".format
        shown = {
            FaultName.STALL: f"{self.stall_after}:{number(self.stall_ms)}",
            FaultName.DRIP: number(self.drip) if self.drip is not None else None,
            FaultName.DELAY_HEADERS: number(self.delay_headers_ms),
        }
        out = [
            name.value if name is FaultName.NO_FINAL else f"{name}={shown.get(name, self.value(name))}"
            for name in self.named()
        ]
        scope = dataclasses.asdict(self.scope)
        out += [
            f"{name}={number(scope[name])}" if name == ScopeName.P else f"{name}={scope[name]}"
            for name in scope
            if scope[name] is not None
        ]
        return out

    def __str__(self) -> str:
        return ";".join(self.items())

    def __bool__(self) -> bool:
        return bool(self.named())

    def merged(self, other: Faults) -> Faults:
        """These faults with what ``other`` asks for on top (its scope is not carried over)."""
        changes = {
            f.name: getattr(other, f.name)
            for f in dataclasses.fields(other)
            if f.name != "scope" and getattr(other, f.name) != f.default
        }
        if other.stall_after is not None:
            changes["stall_ms"] = other.stall_ms
        if any(other.value(name) is not None for name in BREAKS):
            # The connection ends one way: the later spec's.
            changes = {FIELDS[name]: None for name in BREAKS} | changes
        # An event gets one edit: the later spec's (two on one event say nothing clear).
        theirs = {event for event, _ in other.edited_events()}
        overridden = {FIELDS[name]: None for event, name in self.edited_events() if event in theirs}
        return replace(self, **(overridden | changes))


def _last_if_type(item: str) -> bool:
    return item.startswith(f"{FaultName.CONTENT_TYPE}=")


def _item(faults: Faults, name: str, value: str, has_value: bool) -> Faults:
    """``faults`` with one more item of a spec."""
    if name == FaultName.NO_FINAL:
        if has_value:  # no-final=0 would read as no-final: refused, as any value is
            raise ValueError
        return replace(faults, no_final=True)
    if not has_value:
        raise ValueError
    if name in AT_EVENT:
        n = _count(value)
        if name not in (FaultName.DROP_AFTER, FaultName.RESET_AFTER) and n == 0:
            raise FaultError(f"{name} counts events from 1, not 0")
        return replace(faults, **{FIELDS[FaultName(name)]: n})
    if name == FaultName.STALL:
        after, _, ms = value.partition(":")
        return replace(faults, stall_after=_count(after), stall_ms=_ms(ms))
    if name == FaultName.DRIP:
        rate = float(value)
        if not 1 <= rate < float("inf"):
            raise FaultError(f"drip is a rate of at least 1 byte per second, not {value!r}")
        return replace(faults, drip=rate)
    if name == FaultName.STATUS:
        status = int(value)
        if not 200 <= status <= 599:
            raise FaultError(f"status is a final status, 200 to 599, not {value!r}")
        return replace(faults, status=status)
    if name == FaultName.DELAY_HEADERS:
        return replace(faults, delay_headers_ms=_ms(value))
    if name == FaultName.CONTENT_TYPE:
        if not value:
            raise ValueError
        problem = field_problem("Content-Type", value)
        if problem is not None:
            raise FaultError(f"content-type={value!r}: {problem}")
        return replace(faults, content_type=value)
    return replace(faults, scope=_scope(faults.scope, name, value))


def _scope(scope: Scope, name: str, value: str) -> Scope:
    if name in (ScopeName.TIMES, ScopeName.EVERY):
        n = _count(value)
        if n == 0:
            raise FaultError(f"{name} counts requests from 1, not 0")
        return replace(scope, **{name: n})
    if name == ScopeName.P:
        p = float(value)
        if not 0 <= p <= 1:
            raise FaultError(f"p is a probability from 0 to 1, not {value!r}")
        return replace(scope, p=p)
    if name == ScopeName.SEED:
        return replace(scope, seed=int(value))
    if name == ScopeName.PATH:
        if not value.startswith(("/", "*")):
            raise FaultError(f"path is a glob of request paths, starting with / or *, not {value!r}")
        return replace(scope, path=value)
    raise FaultError(f"unknown fault {name!r}; use {FORMS}")


# What each fault and scope takes, and what its placeholder in FORMS stands for.
_TAKES = dict(item.partition("=")[::2] for item in re.split(r"[,;] (?:scope: )?", FORMS))
_MEANS = {
    "N": "a whole number of events, 0 or more",
    "N:MS": "an event count, a colon and milliseconds",
    "MS": "milliseconds, 0 or more",
    "BYTES_PER_S": "bytes a second",
    "S": "an HTTP status",
    "TYPE": "a media type",
    "K": "a whole number of requests",
    "P": "a probability from 0 to 1",
    "GLOB": "a path pattern",
    "seed": "a whole number",  # (its S is no status)
}


def _wanted(name: str) -> str:
    """What the item named ``name`` takes, in words."""
    if name not in _TAKES:
        return f"see {FORMS}"
    form = _TAKES[name]
    if not form:
        return f"{name} takes no value"
    return f"it is {name}={form}, {form} {_MEANS.get(name) or _MEANS.get(form, 'a value')}"


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
