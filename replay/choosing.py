"""Which recording answers a request: the recordings a replay server holds, how often each
was served and to which request, and the choice among those a request matches (recorded
order, the preferred test's first, repeats, resumes, a HEAD answered from a GET)."""

from __future__ import annotations

import dataclasses
import itertools

from yarl import URL

from tasktape.eventlog.jsonrpc_ids import NO_ID, rpc_id, same_id
from tasktape.eventlog.protocols import Request, by_name
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.spans import StreamEvent, events_in
from tasktape.proxy.card import is_card_request

from .matching import Incoming, MatchRules, Shown, mismatches

ID_PREFIX = "tt"  # ids added with add_ids: "tt<exchange>.<event>"


class Recordings:
    """The recordings a server answers with, in recorded order, and their use."""

    def __init__(
        self, rules: MatchRules, shown: Shown, *, allow_repeats: bool, prefer: str | None, add_ids: bool
    ) -> None:
        self.recorded: list[Recorded] = []
        self.used: list[int] = []  # times each recording was served
        self._events: dict[int, list[StreamEvent]] = {}
        self.resumed: set[int] = set()  # recordings served only to clients resuming them
        self._asked: dict[int, Incoming] = {}  # the request each recording last answered from its start
        self._asked_at: dict[int, int] = {}  # and when, in the order of requests served
        self._serial = itertools.count()
        self._by_route: dict[tuple[str, str], list[int]] = {}  # (method, path): indexes
        # The recorded session each replayed one (by the session id its client sends) stands
        # for, once a request told which (MCP: two clients at once, started in another order).
        self._bound: dict[str, str] = {}
        self._sessions: dict[int, str | None] = {}  # each recording's session, read once
        # The last request's session, read once: matching it and serving it both ask.
        self._last_session: tuple[Incoming, str | None] | None = None
        self.rules = rules
        # What reports show of requests: no value at a place the user redacts, or that any
        # recording added holds redacted.
        self.shown = shown
        self.allow_repeats = allow_repeats
        # The test (its node id) whose own recordings answer first when several match.
        self.prefer = prefer
        self.add_ids = add_ids

    def add(self, recorded: Recorded, used: int = 0) -> None:
        route = (recorded.method, decoded_path(recorded.path))
        self._by_route.setdefault(route, []).append(len(self.recorded))
        self.recorded.append(recorded)
        self.used.append(used)
        self.shown = self.shown.learned(recorded)

    # -- what was used -----------------------------------------------------------------------

    def unused(self) -> list[Recorded]:
        return [
            r
            for i, (r, n) in enumerate(zip(self.recorded, self.used, strict=True))
            if not n and i not in self.resumed
        ]

    def answered(self, index: int, incoming: Incoming) -> None:
        """Recording ``index`` answers ``incoming`` from its start (counted as used)."""
        self._asked[index] = incoming
        self._asked_at[index] = next(self._serial)

    def asked(self, index: int, otherwise: Incoming) -> Incoming:
        """The request recording ``index`` last answered from its start; ``otherwise`` if none."""
        return self._asked.get(index, otherwise)

    def answering(self, index: int, incoming: Incoming, counted: bool) -> tuple[int, Incoming]:
        """The recording whose request an answer from recording ``index`` to ``incoming``
        answers, and the request of this run it answers there. A client repeating its
        request gets its own JSON-RPC id; one resuming otherwise gets what the stream's
        start got: a recorded resumption (MCP: a GET after a closed POST stream) what the
        stream it resumes got, when that was served in this run."""
        if rpc_id(incoming.body) is not NO_ID:
            return index, incoming
        origin = self.resumes(index)
        if origin is not None and origin in self._asked:
            return origin, self._asked[origin]
        return index, incoming if counted else self.asked(index, incoming)

    def resumes(self, index: int) -> int | None:
        """The recorded stream a recorded resumption continues, through the resumptions
        between (a GET resuming a GET that resumed a POST stream); None for any other."""
        origin, seen = None, {index}
        while (step := self._resumed(index, seen)) is not None:
            seen.add(step)
            origin = index = step
        return origin

    def _resumed(self, index: int, seen: set[int]) -> int | None:
        """The recorded stream that sent the event recording ``index`` resumed after (its
        Last-Event-ID): one of its route, or one its protocol lets it continue. None for a
        request with a JSON-RPC id of its own (it answers that one)."""
        recorded = self.recorded[index]
        last_id = recorded.resumed_from
        if not last_id or rpc_id(recorded.request_body) is not NO_ID:
            return None
        route = self._by_route.get((recorded.method, decoded_path(recorded.path)), [])
        candidates = [*route, *self._resumable(recorded.as_request())]
        return next(
            (i for i in candidates if i not in seen and any(e.id == last_id for e in self.events_of(i))),
            None,
        )

    def events_of(self, index: int) -> list[StreamEvent]:
        if index not in self._events:
            self._events[index] = events_in(self.recorded[index].chunks)
        return self._events[index]

    # -- choosing ------------------------------------------------------------------------------

    def _matching(self, incoming: Incoming) -> list[int]:
        """Indexes of the recordings that match, in recorded order."""
        candidates = self._by_route.get((incoming.method, incoming.path), [])
        return [
            i for i in candidates if not mismatches(self.facing(incoming, i), self.recorded[i], self.rules)
        ]

    def facing(self, incoming: Incoming, index: int) -> Incoming:
        """``incoming`` as compared with recording ``index``: paths compare decoded, so one
        naming the recorded path however encoded takes its recorded spelling; a HEAD faces
        a recorded GET as that GET (it is answered with the GET's head)."""
        recorded = self.recorded[index]
        if incoming.method == "HEAD" and recorded.method == "GET":
            incoming = dataclasses.replace(incoming, method="GET")
        if recorded.path != incoming.path and decoded_path(recorded.path) == incoming.path:
            return dataclasses.replace(incoming, path=recorded.path)
        return incoming

    def match(self, incoming: Incoming) -> tuple[int, bool] | None:
        """The recording to answer with, and True: it counts as used once more. A request
        without Last-Event-ID is never answered with a recording of one that had it (the
        rest of a stream from some event on), but with a stream from its start."""
        index = self._next(incoming)
        if index is None:
            return None
        self._bind(incoming)
        self.used[index] += 1
        return index, True

    def reset_sessions(self) -> None:
        self._bound.clear()

    def _bind(self, incoming: Incoming) -> None:
        """Bind the request's session to the recorded one, if it is the first to tell which:
        every unused recording it matches is of that one session."""
        session = self.session_of(incoming)
        if session is None or session in self._bound:
            return
        sessions = {self._recorded_session(i) for i in self._matching(incoming) if not self.used[i]}
        if len(sessions) == 1 and (recorded := sessions.pop()) is not None:
            self._bound[session] = recorded

    def session_of(self, incoming: Incoming) -> str | None:
        """The session a request names, as the protocol of a recording of its route reads it."""
        if self._last_session is not None and self._last_session[0] is incoming:
            return self._last_session[1]
        route = self._by_route.get((incoming.method, incoming.path), [])
        protocol = by_name(self.recorded[route[0]].protocol) if route else None
        session = None if protocol is None else protocol.request_info(incoming.as_request()).session_id
        self._last_session = (incoming, session)
        return session

    def _recorded_session(self, index: int) -> str | None:
        if index not in self._sessions:
            recorded = self.recorded[index]
            protocol = by_name(recorded.protocol)
            read = None if protocol is None else protocol.request_info(recorded.as_request()).session_id
            self._sessions[index] = read
        return self._sessions[index]

    def _own_first(self, incoming: Incoming, indexes: list[int]) -> list[int]:
        """``indexes`` with those of the recorded session the request's is bound to first;
        unbound, those of a recorded session no other is bound to."""
        if not self._bound:
            return indexes
        session = self.session_of(incoming)
        mine = self._bound.get(session) if session is not None else None
        if mine is not None:
            return sorted(indexes, key=lambda i: self._recorded_session(i) != mine)
        taken = set(self._bound.values())
        return sorted(indexes, key=lambda i: self._recorded_session(i) in taken)

    def _next(self, incoming: Incoming) -> int | None:
        """The recording ``incoming`` gets next (None: a miss), without using it."""
        # (A recorded empty Last-Event-ID named no event: that request was a fresh one too.)
        matching = [i for i in self._matching(incoming) if not self.recorded[i].resumed_from]
        unused = self._own_first(incoming, self._preferred([i for i in matching if not self.used[i]]))
        if unused:
            return unused[0]  # identical requests are answered in recorded order
        if matching and (self.allow_repeats or is_repeatable(self.recorded[matching[-1]])):
            # A card is the same however often it is asked for, and a browser asks for a
            # preflight as its cache says: the last recorded answers.
            return self._preferred(matching[::-1])[0]
        return None

    def _preferred(self, indexes: list[int]) -> list[int]:
        """``indexes`` with the preferred test's recordings first, each group in the order given."""
        if self.prefer is None:
            return indexes
        return sorted(indexes, key=lambda i: self.recorded[i].recorded_by != self.prefer)

    def match_resumed(self, incoming: Incoming, last_id: str) -> tuple[int, bool] | None:
        """A reconnecting client repeats its request with Last-Event-ID: the recording of
        that very resumption (a client reconnecting as it did when recorded, an MCP GET
        after a closed POST stream) is served as it was; else it resumes the recorded
        stream that holds that event (served before, most likely), or else the one the
        request would get anyway."""
        matching = self._matching(incoming)
        again = [i for i in matching if not self.used[i] and self.recorded[i].resumed_from == last_id]
        if again:
            self.used[again[0]] += 1
            return again[0], True
        holding = [i for i in matching if self.recorded[i].is_sse and self._holds(i, last_id)]
        if not holding:
            holding = [i for i in self._resumable(incoming.as_request()) if self._holds(i, last_id)]
        if holding:
            # Its rest goes to the client it was cut from: it stays for identical requests.
            index = self._served_stream(holding, incoming)
            if self.rest_unrecorded(index, last_id) is not None:
                return None  # a miss (record-missing: the upstream has the rest)
            return index, False
        streams = [i for i in matching if self.recorded[i].is_sse and not self.recorded[i].resumed_from]
        if streams:
            # An id no stream it matches holds: the one it was served says which ids it has.
            return self._served_stream(streams, incoming), False
        return self.match(incoming)

    def rest_unrecorded(self, index: int, last_id: str) -> str | None:
        """Why the stream has no rest recorded after ``last_id``, if it has none: it ends at
        that event without what ends it (the answer, a final state: it was closed early, by
        an MCP server's polling or a client that left), or it broke off there. What came
        after, on a resumption, was never recorded: served, "the rest" would be nothing, and
        the client would ask again, for ever."""
        return self._closed_early(index, last_id) or self._broke_off(index, last_id)

    def _closed_early(self, index: int, last_id: str) -> str | None:
        recorded = self.recorded[index]
        protocol = by_name(recorded.protocol)
        if protocol is None or not protocol.ends_with_close(recorded.as_request()):
            return None
        events = [e for e in self.events_of(index) if e.complete]
        if not events or events[-1].id != last_id or any(protocol.closes(e.data, e.event) for e in events):
            return None
        return (
            f"its stream ends at event {last_id}, before its answer: what came after (the request "
            "resuming it) was not recorded"
        )

    def _broke_off(self, index: int, last_id: str) -> str | None:
        """A recording cut short whose body ends with the event ``last_id`` (its events
        span every byte of it): the one its connection broke in (its id line came, not all
        its data), or the last whole one."""
        recorded = self.recorded[index]
        if not (recorded.is_sse and recorded.cut_short):
            return None
        events = self.events_of(index)
        if not events or events[-1].id != last_id:
            return None
        where = "after" if events[-1].complete else "in"
        return (
            f"its recording breaks off {where} event {last_id} ({recorded.outcome}): what came after "
            "was not recorded"
        )

    def _served_stream(self, streams: list[int], incoming: Incoming) -> int:
        """Of the recorded ``streams``, the one a client resuming with ``incoming`` was most
        likely served: one served to a request with its JSON-RPC id, else the one served
        last; if none was served, the one an identical fresh request gets next."""
        served = [i for i in streams if i in self._asked]
        if served:
            mine = rpc_id(incoming.body)

            def likeliness(i: int) -> tuple[bool, int]:
                theirs = rpc_id(self._asked[i].body)
                return mine is not NO_ID and same_id(mine, theirs), self._asked_at[i]

            return max(served, key=likeliness)
        fresh = self._preferred([i for i in streams if not self.used[i]])
        return fresh[0] if fresh else streams[-1]

    def head_of_get(self, incoming: Incoming) -> int | None:
        """For a HEAD nothing recorded matches: the recorded GET whose head answers it, the
        one an identical GET gets next, as the agent's server answers one. None when that
        GET would miss (used up, without repeats allowed)."""
        if incoming.method != "HEAD":
            return None
        return self._next(dataclasses.replace(incoming, method="GET"))

    def _resumable(self, resuming: Request) -> list[int]:
        """The recorded streams a request it does not match may continue, as their
        protocols say (MCP: a GET resuming a POST stream that broke)."""
        out = []
        for i, r in enumerate(self.recorded):
            protocol = by_name(r.protocol)
            if r.is_sse and protocol is not None and protocol.resumable(resuming, r.as_request()):
                out.append(i)
        return out

    def _holds(self, index: int, event_id: str) -> bool:
        if any(e.id == event_id for e in self.events_of(index)):
            return True
        prefix = f"{ID_PREFIX}{index + 1}."
        return self.add_ids and event_id.startswith(prefix)


def is_card(recorded: Recorded) -> bool:
    """Whether the recording answers an agent card read (answered however often it is asked)."""
    return is_card_request(recorded.method, recorded.path, recorded.request_body)


def is_preflight(recorded: Recorded) -> bool:
    """Whether the recording answers a CORS preflight: a browser sends one as its preflight
    cache says, so their count differs between recording and replay."""
    return recorded.method == "OPTIONS" and any(
        name.lower() == "access-control-request-method" for name, _ in recorded.request_headers
    )


def is_repeatable(recorded: Recorded) -> bool:
    """Whether the recording answers however often it is asked (a card, a preflight)."""
    return is_card(recorded) or is_preflight(recorded)


def decoded_path(path: str) -> str:
    """A path as a server reads it, its percent-encoding decoded (as aiohttp decodes it)."""
    return URL.build(path=path, encoded=True).path
