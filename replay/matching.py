"""Does an incoming request match a recorded one? Matchers are plain functions,
registered by name: each returns None when the two agree, or a short reason why not.

Bodies are compared as JSON, ignoring what the recorded exchange's protocol says its
clients regenerate on every run (A2A: ``messageId`` anywhere, timestamps; MCP: the
progress token), the JSON-RPC ``id``, values that were redacted in the recording, and any
JSON pointer the user names (the id and the pointers in each message of a JSON-RPC batch
too); numbers are compared as numbers (``3`` is ``3.0``), and a field at its default
is one left out only where the protocol says so (A2A's protobuf JSON). Form bodies are
compared field by field (a redacted value matches any), other bodies byte for byte.
Headers are compared only when the user names them (most vary with the client: its
version, tracing ids, lengths).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from operator import itemgetter
from typing import Any
from urllib.parse import parse_qsl

from tasktape.choices import listed
from tasktape.counted import counted
from tasktape.eventlog.frames import protocol_of
from tasktape.eventlog.jsonrpc_ids import is_batch
from tasktape.eventlog.protocols.base import Protocol, Regenerated, Request
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.redact import (
    ANY_DEPTH,
    REDACTED,
    FormType,
    Redactor,
    batch_forms,
    form_type,
    multipart,
    parse_pointer,
)


@dataclass
class Incoming:
    method: str
    path: str
    query: str | None
    body: bytes | None
    headers: list[tuple[str, str]] = field(default_factory=list)

    def as_request(self) -> Request:
        """The request, as the protocols read one."""
        return Request(self.method, self.path, self.headers, self.body)


Place = tuple[str, ...]  # a JSON pointer's parts: "*" any key or index, "**" any depth
A_VALUE = "(a value)"  # what a report shows for a value at a credential's place


@dataclass(frozen=True)
class Shown:
    """What reports (a miss's reasons, a refused request's line) show of requests: they end up
    in test output and CI logs, so no value at a credential's place. Those places: the
    redaction defaults, what the user asks to redact, and every query parameter, header and
    JSON field that a loaded recording holds redacted (:meth:`learned`). A value a request
    sent that holds such a place in a shape its pointer does not follow (a list where it
    names a key, a string where it names a member) may be the credential sent otherwise: it
    shows as its type and size only (:meth:`sent`)."""

    query_names: frozenset[str] = frozenset()  # lowercased
    header_names: frozenset[str] = frozenset()  # lowercased
    places: frozenset[Place] = frozenset()
    batch_places: frozenset[Place] = frozenset()  # the places in each message of a JSON-RPC batch
    _query: Redactor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_query", Redactor(query=self.query_names, defaults=False))

    @classmethod
    def of(cls, redactor: Redactor) -> Shown:
        """What ``redactor`` redacts (its defaults too, if it has them), in each message of
        a JSON-RPC batch too, as it redacts them."""
        paths = [parse_pointer(p) for p in redactor.json_pointers]
        return cls(redactor.query_params, redactor.headers, frozenset(paths), frozenset(batch_forms(paths)))

    @classmethod
    def knowing(cls, redactor: Redactor, recorded: Iterable[Recorded]) -> Shown:
        """What ``redactor`` redacts and what any of ``recorded`` holds redacted: known
        before the first of them is said."""
        shown = cls.of(redactor)
        for r in recorded:
            shown = shown.learned(r)
        return shown

    def learned(self, recorded: Recorded) -> Shown:
        """These places and those ``recorded`` holds a redacted value at (list indexes as
        any: a field redacted in one item is a credential in every other); a form field's
        name is a query parameter's, as the recorder redacts both by the same names."""
        query = {name.lower() for name, value in _parameters(recorded.query) if value == REDACTED}
        query |= {f.name.lower() for f in _recorded_fields(recorded) or () if f.name and f.redacted}
        headers = {name.lower() for name, value in recorded.request_headers if value == REDACTED}
        body = recorded.request_body or b""
        places = set(_redacted_places(_json(body), ())) if REDACTED.encode() in body else set()
        if query <= self.query_names and headers <= self.header_names and places <= self.places:
            return self
        return Shown(
            self.query_names | query, self.header_names | headers, self.places | places, self.batch_places
        )

    def query(self, raw: str | None) -> str | None:
        """A query with each credential's value ``[REDACTED]``."""
        return self._query.query(raw)

    def request_line(self, request: Incoming | Recorded) -> str:
        """``METHOD /path?query`` with the query's credentials redacted."""
        return f"{request.method} {request.path}" + (f"?{self.query(request.query)}" if request.query else "")

    def hides_field(self, name: str) -> bool:
        """Whether a form field's value is a credential's (named as query parameters are)."""
        return name.lower() in self.query_names

    def hides_header(self, name: str) -> bool:
        return name.lower() in self.header_names

    def hides(self, at: Place) -> bool:
        """Whether the JSON value at ``at`` is a credential's."""
        return any(_covers(place, at) for place in (*self.places, *self.batch_places))

    def json(self, value: Any, at: Place) -> str:
        """The JSON value at ``at`` as a mismatch shows it: a credential's as ``(a value)``,
        any within it ``"[REDACTED]"``; cut when long."""
        return self._shown(value, at, outline=False)

    def sent(self, value: Any, at: Place) -> str:
        """A value a request sent, at ``at``, as :meth:`json` shows it; but one holding a
        credential's place in another shape than its pointer names (it may be the credential
        sent otherwise) as its type and size: ``(a list of 1 item)``."""
        return self._shown(value, at, outline=True)

    def _shown(self, value: Any, at: Place, outline: bool) -> str:
        if self.hides(at):
            return A_VALUE
        masked = self._masked(value, at, outline)
        return masked if isinstance(masked, _Outline) else _cut(json.dumps(masked, ensure_ascii=False))

    def _below(self, at: Place) -> list[Place]:
        """The rest of each credential's place that lies below ``at``. A batch message's
        places start at an index (``*`` there stands for no key of an object)."""
        batch = self.batch_places if not at or at[0].isdigit() else frozenset()
        rests = (_below(place, at) for place in (*self.places, *batch))
        return [rest for rest in rests if rest]

    def _masked(self, value: Any, at: Place, outline: bool) -> Any:
        if self.hides(at):
            return REDACTED
        if outline and (below := self._below(at)) and not _follows(value, below):
            return _Outline.of(value)
        if isinstance(value, dict):
            return {k: self._masked(v, (*at, k), outline) for k, v in value.items()}
        if isinstance(value, list):
            return [self._masked(v, (*at, str(i)), outline) for i, v in enumerate(value)]
        return value


def _redacted_places(value: Any, at: Place) -> Iterator[Place]:
    if value == REDACTED:
        yield at
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _redacted_places(item, (*at, key))
    elif isinstance(value, list):
        for item in value:
            yield from _redacted_places(item, (*at, "*"))


def _below(place: Place, at: Place) -> Place | None:
    """What of ``place`` lies below ``at``, when ``at`` holds what it names; None when it
    does not. A ``**`` finds its field at any depth: only what is above it holds it."""
    for i, part in enumerate(at):
        if i >= len(place) or place[i] == ANY_DEPTH or place[i] not in ("*", part):
            return None
    return place[len(at) :]


def _follows(value: Any, below: list[Place]) -> bool:
    """Whether a pointer to the places ``below`` a value can reach into it: an object's
    members by key, a list's items by index (``*``, ``**`` or a number next)."""
    if isinstance(value, dict):
        return True
    return isinstance(value, list) and any(rest[0] in ("*", ANY_DEPTH) or rest[0].isdigit() for rest in below)


class _Outline(str):
    """A value shown as its type and size, not what it holds."""

    @classmethod
    def of(cls, value: Any) -> _Outline:
        if isinstance(value, dict):
            return cls(f"(an object of {counted(len(value), 'member')})")
        if isinstance(value, list):
            return cls(f"(a list of {counted(len(value), 'item')})")
        if isinstance(value, str):
            return cls(f"(a string of {counted(len(value), 'character')})")
        return cls("(a number)" if _number(value) else json.dumps(value))  # true, false, null say nothing


def _covers(place: Place, at: Place) -> bool:
    """Whether the pointer ``place`` (``*``: any key or index; ``**``: any depth) names ``at``."""
    if not place:
        return not at
    head, rest = place[0], place[1:]
    if head == ANY_DEPTH:
        return _covers(rest, at) or (bool(at) and _covers(place, at[1:]))
    return bool(at) and head in ("*", at[0]) and _covers(rest, at[1:])


SHOWN_BY_DEFAULT = Shown.of(Redactor())  # the redaction defaults alone


_MISSING = object()
_NOTHING = Regenerated()
Difference = tuple[Place, Any, Any]  # where two bodies differ: the place, the incoming value, the recorded


@dataclass(frozen=True)
class MatchRules:
    """What the user says about matching: JSON pointers that body comparison ignores
    (beyond the volatile keys), and headers that must match (lowercased names)."""

    ignore: tuple[tuple[str, ...], ...] = ()
    headers: tuple[str, ...] = ()

    @classmethod
    def of(cls, ignore: Iterable[str] = (), headers: Iterable[str] = ()) -> MatchRules:
        ignore, headers = listed(ignore, "ignore"), listed(headers, "headers")
        return cls(tuple(parse_pointer(p) for p in ignore), tuple(h.lower() for h in headers))


# A matcher: None when the two agree, else why not (said as ``Shown`` lets a report say it).
Matcher = Callable[[Incoming, Recorded, MatchRules, Shown], str | None]


def method(incoming: Incoming, recorded: Recorded, rules: MatchRules, shown: Shown) -> str | None:
    return None if incoming.method == recorded.method else f"method {incoming.method} vs {recorded.method}"


def path(incoming: Incoming, recorded: Recorded, rules: MatchRules, shown: Shown) -> str | None:
    return None if incoming.path == recorded.path else f"path {incoming.path} vs {recorded.path}"


def query(incoming: Incoming, recorded: Recorded, rules: MatchRules, shown: Shown) -> str | None:
    """The same parameters, names in any order but the values of a repeated name in the
    same order (``a=1&a=0`` is a list, which a server reads in order); a value redacted in
    the recording matches any."""
    mine, theirs = _parameters(incoming.query), _parameters(recorded.query)
    if len(mine) == len(theirs) and all(
        a[0] == b[0] and b[1] in (a[1], REDACTED) for a, b in zip(mine, theirs, strict=True)
    ):
        return None
    mine, theirs = shown.query(incoming.query) or "(none)", shown.query(recorded.query) or "(none)"
    return f"query {mine} vs {theirs}" + (" (a hidden value differs)" if mine == theirs else "")


def _parameters(raw: str | None, encoding: str = "utf-8") -> list[tuple[str, str]]:
    """A query's parameters, sorted by name (a stable sort: a repeated name's values keep
    their order); separated by '&' or ';', as redaction reads them (a recording's
    ``token=[REDACTED];api_key=[REDACTED]`` is two)."""
    text = (raw or "").replace(";", "&")
    return sorted(parse_qsl(text, keep_blank_values=True, encoding=encoding), key=itemgetter(0))


def body(incoming: Incoming, recorded: Recorded, rules: MatchRules, shown: Shown) -> str | None:
    found = _body_differences(incoming, recorded, rules)
    if found is None:
        return _form_body(incoming, recorded, shown)
    if not found:
        return None
    differences = [_difference(at, a, b, shown) for at, a, b in found[:3]]
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return f"body differs at {', '.join(differences)}{more}"


def _difference(at: Place, a: Any, b: Any, shown: Shown) -> str:
    """A body's difference as a mismatch says it: its JSON pointer and the two values (the
    incoming ``a``, as a request sent it; the recorded ``b``)."""
    mine = "(absent)" if a is _MISSING else shown.sent(a, at)
    theirs = "(absent)" if b is _MISSING else shown.json(b, at)
    pointer = "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in at)
    return f"{pointer} ({mine} vs {theirs})"


def _body_differences(incoming: Incoming, recorded: Recorded, rules: MatchRules) -> list[Difference] | None:
    """Where the bodies differ, as JSON: each place, the incoming value there and the
    recorded one; None when they differ and one is not JSON."""
    mine, theirs = incoming.body or b"", recorded.request_body or b""
    if mine == theirs:
        return []
    a, b = _json(mine), _json(theirs)
    if a is _MISSING or b is _MISSING:
        return None
    return list(_differences(a, b, (), _Comparison.of(recorded, b, rules)))


@dataclass(frozen=True)
class _Field:
    """A form body's field (a multipart part's name, headers and content; an urlencoded
    field's name and value), or a piece of a multipart body that is no field (no name)."""

    name: str | None
    value: bytes
    head: bytes = b""

    @property
    def redacted(self) -> bool:
        return self.value == _REDACTED_BYTES

    def matched_by(self, incoming: _Field) -> bool:
        """Whether ``incoming`` matches this recorded field: a redacted value matches any."""
        return (incoming.name, incoming.head) == (self.name, self.head) and (
            self.redacted or incoming.value == self.value
        )


_REDACTED_BYTES = REDACTED.encode()


def _form_body(incoming: Incoming, recorded: Recorded, shown: Shown) -> str | None:
    """Bodies that are not both JSON, compared as forms when the request's Content-Type
    says it is one (field by field: a value redacted in the recording matches any), or
    byte for byte."""
    mine, theirs = incoming.body or b"", recorded.request_body or b""
    fields = _form_fields(incoming, recorded)
    if fields is None:
        return f"body differs ({len(mine)} vs {len(theirs)} bytes, not JSON)"
    a, b = fields
    if _same_fields(a, b):
        return None
    differences = [
        _field_difference(name, a, b, shown) for name in _differing_names(a, b) if name is not None
    ]
    if not differences:  # the same fields, in another order or between other bytes
        return f"body differs ({len(mine)} vs {len(theirs)} bytes, the form's fields alike)"
    more = f" and {len(differences) - 3} more" if len(differences) > 3 else ""
    return f"body differs at {', '.join(differences[:3])}{more}"


def _same_fields(mine: list[_Field], theirs: list[_Field]) -> bool:
    return len(mine) == len(theirs) and all(b.matched_by(a) for a, b in zip(mine, theirs, strict=True))


def _differing_names(mine: list[_Field], theirs: list[_Field]) -> list[str | None]:
    """The names whose fields differ (None: the pieces of a multipart body that are no field)."""
    names = dict.fromkeys(f.name for f in (*mine, *theirs))
    return [n for n in names if not _same_fields(_named(mine, n), _named(theirs, n))]


def _named(fields: list[_Field], name: str | None) -> list[_Field]:
    return [f for f in fields if f.name == name]


def _field_difference(name: str, mine: list[_Field], theirs: list[_Field], shown: Shown) -> str:
    """A form field's difference as a mismatch says it: its values, a credential's never
    (named so, or redacted in the recording)."""
    mine, theirs = _named(mine, name), _named(theirs, name)
    secret = shown.hides_field(name) or any(f.redacted for f in theirs)
    a = _shown([_text(f.value) for f in mine], secret)
    b = _shown([_text(f.value) for f in theirs], secret)
    heads_differ = [f.head for f in mine] != [f.head for f in theirs]
    alike = " (a part's headers differ)" if heads_differ else " (a hidden value differs)"
    label = _text(name.encode("utf-8", "surrogateescape"))  # (no escape left to print)
    return f"form field {label} ({a} vs {b})" + (alike if a == b else "")


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _form_fields(incoming: Incoming, recorded: Recorded) -> tuple[list[_Field], list[_Field]] | None:
    """The two bodies' fields, compared in this order (an urlencoded form's by name, a
    repeated name's values in order, as a query's; a multipart form's parts as they come),
    when the requests' Content-Types say it is one (one of them may have none); None when
    they do not, or say different things (a body is never read as what it is not: its
    values would show), or when either body is JSON (compared as JSON, or as bytes)."""
    mine, theirs = incoming.body or b"", recorded.request_body or b""
    types = _content_type(incoming.headers), _content_type(recorded.request_headers)
    kinds = {form_type(t) for t in types if t is not None}
    kind = kinds.pop() if len(kinds) == 1 else None
    if kind is None or _json(mine) is not _MISSING or _json(theirs) is not _MISSING:
        return None
    if kind is FormType.URLENCODED:
        return _urlencoded(mine), _urlencoded(theirs)
    # Each body cut by its own boundary (which many clients make up on every request).
    own = [t if form_type(t) is FormType.MULTIPART else None for t in types]
    a = _multipart(mine, own[0] or own[1] or "")
    b = _multipart(theirs, own[1] or own[0] or "")
    return None if a is None or b is None else (a, b)


def _recorded_fields(recorded: Recorded) -> list[_Field] | None:
    """A recorded form body's fields; None for a body that is no form."""
    body, content_type = recorded.request_body or b"", _content_type(recorded.request_headers)
    kind = form_type(content_type)
    if kind is None or _REDACTED_BYTES not in body:
        return None
    return _urlencoded(body) if kind is FormType.URLENCODED else _multipart(body, content_type or "")


def _urlencoded(body: bytes) -> list[_Field]:
    """Byte for byte: every byte a character, percent-escapes decoded so too; names read
    as UTF-8 (bytes that are not kept as escapes)."""
    fields = _parameters(body.decode("latin-1"), "latin-1")
    return [_Field(_name(n.encode("latin-1")), v.encode("latin-1")) for n, v in fields]


def _multipart(body: bytes, content_type: str) -> list[_Field] | None:
    form = multipart(body, content_type)
    if form is None:
        return None
    parts = (
        _Field(p.name and _name(p.name.encode("utf-8", "surrogateescape")), p.content, p.head)
        for p in form.parts
    )
    return [_Field(None, form.preamble), *parts]


def _name(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _content_type(pairs: Iterable[tuple[str, str]]) -> str | None:
    return next(iter(_header_values(pairs, "content-type")), None)


def headers(incoming: Incoming, recorded: Recorded, rules: MatchRules, shown: Shown) -> str | None:
    """Each header the rules name: the same values in the same order (or absent from both);
    a value redacted in the recording matches any."""
    for name in rules.headers:
        mine, theirs = _header_values(incoming.headers, name), _header_values(recorded.request_headers, name)
        if len(mine) != len(theirs) or any(b not in (a, REDACTED) for a, b in zip(mine, theirs, strict=True)):
            secret = shown.hides_header(name) or REDACTED in theirs
            return f"header {name} {_shown(mine, secret)} vs {_shown(theirs, secret)}"
    return None


MATCHERS: dict[str, Matcher] = {
    "method": method,
    "path": path,
    "query": query,
    "body": body,
    "headers": headers,
}
DEFAULT_MATCHERS = ("method", "path", "query", "body", "headers")


def mismatches(
    incoming: Incoming,
    recorded: Recorded,
    rules: MatchRules,
    matchers: Iterable[str] = DEFAULT_MATCHERS,
    *,
    shown: Shown = SHOWN_BY_DEFAULT,
) -> list[str]:
    """Why ``incoming`` does not match ``recorded``, as ``shown`` lets a report say it:
    empty when it does."""
    return [reason for name in matchers if (reason := MATCHERS[name](incoming, recorded, rules, shown))]


def distance(incoming: Incoming, recorded: Recorded, rules: MatchRules) -> tuple[bool, bool, int, int]:
    """How far ``incoming`` is from ``recorded``, to list the nearest recordings of a miss
    first: the HTTP method, the path, the operation (a JSON-RPC body's method: on one
    endpoint, every request has the same path), then how many other things differ (each
    body field, a body that is not JSON, the query, the headers)."""
    found = _body_differences(incoming, recorded, rules)
    places = [at for at, _, _ in found] if found is not None else [()] * _form_distance(incoming, recorded)
    operation = places.count(("method",))
    others = len(places) - operation
    others += query(incoming, recorded, rules, SHOWN_BY_DEFAULT) is not None
    others += headers(incoming, recorded, rules, SHOWN_BY_DEFAULT) is not None
    return (
        method(incoming, recorded, rules, SHOWN_BY_DEFAULT) is not None,
        path(incoming, recorded, rules, SHOWN_BY_DEFAULT) is not None,
        operation,
        others,
    )


def _form_distance(incoming: Incoming, recorded: Recorded) -> int:
    """How many fields of two form bodies differ (1 for bodies that are no form)."""
    fields = _form_fields(incoming, recorded)
    if fields is None:
        return 1
    a, b = fields
    return 0 if _same_fields(a, b) else max(1, len(_differing_names(a, b)))


def _header_values(pairs: Iterable[tuple[str, str]], name: str) -> list[str]:
    return [v for k, v in pairs if k.lower() == name]


def _shown(values: list[str], secret: bool) -> str:
    """Header values for a mismatch message: a credential's (a header redacted by default
    or in the recording) never, since it would end up in test output and logs; long ones cut."""
    if not values:
        return "(absent)"
    if secret:
        return A_VALUE if len(values) == 1 else f"({len(values)} values)"
    return ", ".join(json.dumps(_cut(v)) for v in values)


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return _MISSING


@dataclass(frozen=True)
class _Comparison:
    """How two bodies are compared: what is ignored, and whether a field at its default is
    one left out (as the recorded exchange's protocol says; no protocol: it is not)."""

    rules: MatchRules
    regenerated: Regenerated
    jsonrpc: JsonRpc
    defaults_are_absent: bool

    @classmethod
    def of(cls, recorded: Recorded, body: Any, rules: MatchRules) -> _Comparison:
        return cls.under(protocol_of(recorded), body, rules)

    @classmethod
    def under(cls, protocol: Protocol | None, body: Any, rules: MatchRules) -> _Comparison:
        jsonrpc = JsonRpc.of(body)
        if protocol is None:
            return cls(rules, _NOTHING, jsonrpc, defaults_are_absent=False)
        return cls(rules, protocol.regenerated, jsonrpc, protocol.defaults_are_absent)

    def ignored(self, path: tuple[str, ...]) -> bool:
        """Whether the value at ``path`` is left out of the comparison: in each message of a
        JSON-RPC batch, what is left out of a single message (its id, what the protocol
        regenerates, what the rules name) is too, as redaction reads a batch."""
        if path and path[-1] in self.regenerated.keys:
            return True
        message = path[1:] if self.jsonrpc is JsonRpc.BATCH and path[:1] and path[0].isdigit() else None
        if (path if self.jsonrpc is JsonRpc.MESSAGE else message) == ("id",):
            return True
        rules = (*self.rules.ignore, *self.regenerated.pointers)
        return any(_names(rule, path) or (message is not None and _names(rule, message)) for rule in rules)

    def left_out(self, value: Any) -> bool:
        """Whether a value says what leaving its field out says. In protobuf JSON, null and
        every default do, so one client's ``"configuration": {}`` matches another's omission."""
        if value is _MISSING:
            return True
        return self.defaults_are_absent and (
            value is None or value in ({}, [], "") or value is False or _zero(value)
        )

    @staticmethod
    def opened(a: Any, b: Any) -> tuple[Any, Any]:
        """An object left out, beside one that is not, as the empty object to compare its
        members with: SDKs differ in sending ``"params": {}`` or nothing, and an object
        whose every member is ignored (MCP's ``_meta`` holding only the progress token)
        says what leaving it out says."""
        if a is _MISSING and type(b) is dict:
            return {}, b
        if b is _MISSING and type(a) is dict:
            return a, {}
        return a, b


class JsonRpc(StrEnum):
    """What a JSON body is to JSON-RPC: one message, a batch of them, or neither."""

    MESSAGE = "message"
    BATCH = "batch"
    NONE = "none"

    @classmethod
    def of(cls, body: Any) -> JsonRpc:
        if isinstance(body, dict) and "jsonrpc" in body:
            return cls.MESSAGE
        return cls.BATCH if is_batch(body) else cls.NONE


def _names(rule: Place, path: Place) -> bool:
    """Whether the pointer ``rule`` (``*``: any key or index) names ``path``."""
    return len(rule) == len(path) and all(r in ("*", p) for r, p in zip(rule, path, strict=True))


def _differences(a: Any, b: Any, at: Place, how: _Comparison) -> Iterable[Difference]:
    """Where the incoming value ``a`` and the recorded ``b`` differ: each place, and the
    two values there."""
    if how.ignored(at) or b == REDACTED:
        return
    if how.left_out(a) and how.left_out(b):
        return
    a, b = how.opened(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            yield from _differences(a.get(key, _MISSING), b.get(key, _MISSING), (*at, key), how)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _differences(x, y, (*at, str(i)), how)
    elif not _same(a, b):
        yield at, a, b


def _number(value: Any) -> bool:
    """A JSON number (``true`` is no number, though Python's bool is an int)."""
    return type(value) in (int, float)


def _zero(value: Any) -> bool:
    return _number(value) and value == 0


def _same(a: Any, b: Any) -> bool:
    """Whether two JSON values (neither an object nor a list to compare member by member)
    are equal: JSON has one number type, so ``3`` is ``3.0``; ``true`` is not ``1``."""
    if _number(a) and _number(b):
        return bool(a == b)
    return type(a) is type(b) and a == b


def _cut(text: str) -> str:
    """At most 40 characters of a value shown in a mismatch."""
    return text if len(text) <= 40 else text[:37] + "..."


# -- keys: what finds the candidates among many recordings ---------------------------------

_DROPPED = ("(as if absent)",)  # a value that matches a missing one: ignored, at its default


def match_key(request: Incoming, protocol: Protocol | None, rules: MatchRules) -> Hashable | None:
    """A key that two requests matching under ``protocol`` (the one whose recording they
    are compared with) share: the query, the headers the rules name and the body as
    matching reads it (ignored fields and fields at their default left out, numbers as
    numbers). Some requests that do not match may share one too: a key finds candidates,
    :func:`mismatches` decides. None for a request holding a redacted value, which matches
    any there: it is compared with each."""
    parameters = _parameters(request.query)
    named = tuple(tuple(_header_values(request.headers, name)) for name in rules.headers)
    if any(value == REDACTED for _, value in parameters) or any(REDACTED in v for v in named):
        return None
    raw = request.body or b""
    parsed = _json(raw)
    if parsed is _MISSING:
        fields = _form_key(raw, _content_type(request.headers))
        return None if fields is None else (tuple(parameters), named, fields)
    if _REDACTED_BYTES in raw:  # (as the recorder writes a redacted value: a string of its own)
        return None
    return tuple(parameters), named, _normal(parsed, (), _Comparison.under(protocol, parsed, rules))


def _form_key(body: bytes, content_type: str | None) -> Hashable | None:
    """A body that is not JSON as matching may read it: as an urlencoded form's fields,
    in any order, since the Content-Type of the request it is compared with may say it is
    one (bytes that match byte for byte have the same fields too). None for one holding a
    redacted value, and for a multipart body, whose boundary each client makes up: both are
    compared with each."""
    if _REDACTED_BYTES in body or form_type(content_type) is FormType.MULTIPART:
        return None
    fields = _urlencoded(body)
    return None if any(f.redacted for f in fields) else tuple((f.name, f.value) for f in fields)


def _normal(value: Any, at: tuple[str, ...], how: _Comparison) -> Hashable:
    """``value`` as :func:`_differences` compares it: every value it takes as equal to
    another maps to the same (``_DROPPED`` for those equal to an absent one)."""
    if how.ignored(at):
        return _DROPPED
    if how.left_out(value):
        return _DROPPED
    if isinstance(value, dict):
        members = ((key, _normal(item, (*at, key), how)) for key, item in value.items())
        kept = tuple(sorted((key, item) for key, item in members if item is not _DROPPED))
        return kept or _DROPPED  # an object whose every member is as if absent is too
    if isinstance(value, list):
        return ("[]", *(_normal(item, (*at, str(i)), how) for i, item in enumerate(value)))
    if type(value) is float and value.is_integer():
        return int(value)  # 3.0 is 3
    return value
