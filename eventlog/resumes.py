"""The ``resumes`` table: what a resuming recorder (``tasktape record --resume``) did
when one side of a stream reconnected. One row per reconnect a client made, and per
rejoin of an agent stream that broke."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tasktape.counted import counted

# What tells one resume row from another, wherever logs meet (a merge, a fleet's sink): its
# stream and new exchange, side, outcome and the event it resumed after; not its time, which
# a log imported from a cassette of it holds to the microsecond.
SAME_RESUME = ("exchange_id", "side", "last_event_id", "new_exchange_id", "outcome")


class ResumeSide(StrEnum):
    CLIENT = "client"  # a client came back with Last-Event-ID
    UPSTREAM = "upstream"  # the agent's stream broke, and the recorder subscribed again


class ResumeOutcome(StrEnum):
    RESUMED = "resumed"  # a client was sent the events after its Last-Event-ID, then the tail
    ENDED = "ended"  # its Last-Event-ID names the last event of a stream that ended: a 204
    REFUSED = "refused"  # its Last-Event-ID names no event of the stream held: a 400
    FORWARDED = "forwarded"  # such a request went to the agent instead (--resume-unknown forward)
    REJOINED = "rejoined"  # the agent's stream goes on through a subscribe: nothing lost
    CAUGHT_UP = "caught_up"  # not subscribed to (its task had ended): caught up from the task itself
    GAP = "gap"  # rejoined, but the agent's snapshot lacked something clients were owed
    GAVE_UP = "gave_up"  # no subscribe succeeded within --rejoin-for, or the agent refused it
    NOT_RESUMABLE = "not_resumable"  # nothing to subscribe to: no task yet, or not A2A


BROKE = "the agent's stream broke"  # why an agent's stream is followed again, mostly


@dataclass(frozen=True)
class Resume:
    """One row of ``resumes`` (``at`` is when it is written)."""

    exchange_id: int  # the stream resumed
    side: ResumeSide
    outcome: ResumeOutcome
    last_event_id: str | None = None  # the client's, or the last event clients had been sent
    events_from_log: int | None = None  # held events sent (client), or caught up against (upstream)
    new_exchange_id: int | None = None  # the reconnecting request's exchange, or the subscribe's
    attempts: int | None = None  # subscribes sent (upstream)
    synthesized: tuple[str, ...] = ()  # ids of the events the recorder made up to catch clients up
    error: str | None = None  # why it was refused or gave up, or the gap
    live: bool = True  # (a client's, resumed) the stream was still coming: the console says so
    # (upstream) why the agent's stream was followed again when it did not break (a client
    # woke a stream taken up from the log): the console says it instead of a break.
    taken_up: str | None = None

    def describe(self) -> str:
        """One line for the console."""
        if self.side is ResumeSide.CLIENT:
            head = f"exchange {self.exchange_id}: a client reconnected after {shown_id(self.last_event_id)}"
            if self.outcome is ResumeOutcome.RESUMED:
                sent = f"{counted(self.events_from_log or 0, 'event')} from the log"
                then = "then the live tail" if self.live else "the rest of the stream, which had ended"
                return f"{head}: {sent}, {then} (exchange {self.new_exchange_id})"
            if self.outcome is ResumeOutcome.ENDED:
                return f"{head}, the stream's last event: told it had ended (exchange {self.new_exchange_id})"
            if self.outcome is ResumeOutcome.FORWARDED:
                return f"{head}: forwarded to the agent by exchange {self.new_exchange_id} ({self.error})"
            return f"{head}: {self.outcome} ({self.error})"
        head = f"exchange {self.exchange_id}: {self.taken_up or BROKE}"
        if self.outcome is ResumeOutcome.REJOINED:
            tries = counted(self.attempts or 0, "subscribe")
            made = (
                f", {counted(len(self.synthesized), 'event')} made up to catch up" if self.synthesized else ""
            )
            return f"{head}: rejoined by exchange {self.new_exchange_id} ({tries}{made})"
        if self.outcome is ResumeOutcome.CAUGHT_UP:
            return f"{head}: its task had ended; caught up from exchange {self.new_exchange_id}"
        if self.outcome is ResumeOutcome.GAP:
            return f"{head}: rejoined by exchange {self.new_exchange_id}, with a gap: {self.error}"
        return f"{head}: {self.outcome.replace('_', ' ')} ({self.error})"


@dataclass(frozen=True)
class CarriedResume:
    """A row of ``resumes`` as the exchange that carries it in a cassette holds it: the
    reconnect's or subscribe's exchange (its ``new_exchange_id``), or, for a resume that
    has none, the stream it resumed. Its exchanges are positions, counted from it."""

    of: int  # the stream resumed, counted back from the carrier (0: the carrier itself)
    side: ResumeSide
    outcome: ResumeOutcome
    offset_ns: int = 0  # when, after the carrier started
    last_event_id: str | None = None
    events_from_log: int | None = None
    attempts: int | None = None
    synthesized: tuple[str, ...] = ()
    error: str | None = None

    def row(self, stream: int, carrier: int) -> Resume:
        """The row it is in a log whose exchanges ``stream`` and ``carrier`` it names."""
        return Resume(
            stream,
            self.side,
            self.outcome,
            last_event_id=self.last_event_id,
            events_from_log=self.events_from_log,
            new_exchange_id=None if self.of == 0 else carrier,
            attempts=self.attempts,
            synthesized=self.synthesized,
            error=self.error,
        )


INSERT_RESUME = (
    "INSERT INTO resumes (exchange_id, at, at_ns, side, last_event_id, events_from_log, "
    "new_exchange_id, outcome, attempts, synthesized, error) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)


SHOWN = 80  # characters of an event id a message shows (a header may hold 64 KiB of one)


def shown_id(event_id: str | None) -> str:
    """An event id as messages show it: cut short when it is long."""
    if event_id is None or len(event_id) <= SHOWN:
        return str(event_id)
    return f"{event_id[:SHOWN]}... ({len(event_id):,} characters)"
