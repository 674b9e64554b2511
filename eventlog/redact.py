"""Redaction: credentials and chosen JSON fields never reach the log.

Headers and query parameters are redacted by name (case-insensitive); so are the query
parameters of the URLs in ``Referer``, ``Location`` and ``Content-Location`` headers, of
each ``<URL>`` in a ``Link`` header (RFC 8288: paging links often carry a token) and of
``Refresh``'s ``url=``, and their user and password are left out; a fragment's
``name=value`` list is redacted as a query is (``#access_token=...``). So are the fields of
a form body (``application/x-www-form-urlencoded``, ``multipart/form-data``), request or
response, by the same names. JSON fields are named by JSON pointers (RFC 6901, plus ``*`` for any key
or index, e.g. ``/params/message/metadata/apiKey`` or ``/*/metadata/token``). A redacted
JSON value is replaced in the original bytes, so the rest of the document keeps its exact
formatting;
when that cannot be done safely, the document is re-serialized with the values replaced.
Every copy of a redacted value in the same document is replaced too (a key equal to one
included). In a JSON-RPC batch (an array of JSON-RPC messages) a pointer applies to each
message too. Text that looks like JSON but cannot be read is replaced whole, since it could
hold what should not be kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from email.errors import HeaderParseError
from email.header import decode_header
from email.message import Message
from email.parser import HeaderParser
from email.policy import compat32
from email.utils import collapse_rfc2231_value
from enum import StrEnum
from typing import Any
from urllib.parse import unquote_plus, unquote_to_bytes

from tasktape.choices import listed
from tasktape.errors import UsageError

from .listed import header_problem, headers_listed

REDACTED = "[REDACTED]"
DEFAULT_HEADERS = (
    "authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key",
    "x-goog-api-key", "x-auth-token", "private-token",
)  # fmt: skip
# Headers whose value is a URL, which can carry a credential in its query string or its
# user and password.
URL_HEADERS = frozenset(("referer", "location", "content-location"))
# Headers with a URL after ``url=`` (``Refresh: 0; url=...``).
URL_PARAMETER_HEADERS = frozenset(("refresh",))
_URL_PARAMETER = re.compile(r"(url\s*=\s*['\"]?)([^'\"\s]+)", re.IGNORECASE)
# Headers listing URLs in angle brackets, each with parameters after it (RFC 8288).
LINK_HEADERS = frozenset(("link",))
_LINK_TARGET = re.compile(r"<([^>]*)>")
# Query parameters that carry credentials in the APIs agents are commonly reached through.
DEFAULT_QUERY = (
    "key", "api_key", "apikey", "api-key", "access_token", "access-token", "refresh_token", "id_token",
    "token", "auth", "password", "secret", "client_secret", "signature", "sig", "x-amz-signature",
    "x-amz-credential", "x-amz-security-token",
)  # fmt: skip
# Words that, in an option's name, say its value is a credential (beside the query
# parameters redacted): ``--passwd``, ``--pw``, ``--credentials``, ``--bearer``.
CREDENTIAL_WORDS = frozenset(("passwd", "pw", "credentials", "bearer"))
# Options that give a request header as ``NAME: VALUE`` in the same argument (curl's
# ``--header=NAME: VALUE``, ``-HNAME: VALUE``).
HEADER_OPTIONS = ("--header=", "-H")


class Redactor:
    """What to redact; applied by the log writer to everything it stores."""

    def __init__(
        self,
        headers: Iterable[str] = (),
        json_pointers: Iterable[str] = (),
        *,
        query: Iterable[str] = (),
        defaults: bool = True,
    ) -> None:
        headers, query = listed(headers, "headers"), listed(query, "query")
        names = [*DEFAULT_HEADERS, *headers] if defaults else list(headers)
        self.headers = frozenset(n.lower() for n in names)
        # Every header whose value redaction may change (the rest are kept as they are).
        self.changed_headers = self.headers | URL_HEADERS | LINK_HEADERS | URL_PARAMETER_HEADERS
        params = [*DEFAULT_QUERY, *query] if defaults else list(query)
        self.query_params = frozenset(n.lower() for n in params)
        self.json_pointers = listed(json_pointers, "json_pointers")
        self._paths = [parse_pointer(p) for p in self.json_pointers]

    def header_pairs(self, pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """Credential headers redacted whole; headers that hold URLs (``Referer``,
        ``Location``, ``Content-Location``, ``Link``) keep them, with their query strings
        redacted. (Most headers are none of those: taken as they are.) Headers of another
        shape (a dict, names that are no text) are a :class:`UsageError` saying what to pass."""
        if type(pairs) is not list:  # (the writers' are lists: they take no look)
            pairs = headers_listed(pairs, "the headers")
        changed = self.changed_headers
        try:
            return [
                (k, v) if (name := k.lower()) not in changed else (k, self.header_value(name, v))
                for k, v in pairs
            ]
        except (ValueError, TypeError, AttributeError):
            problem = header_problem(pairs, "the headers")
            if problem is None:
                raise  # pairs of strings: a fault of this reading, not of the headers
            raise UsageError(problem) from None

    def header_value(self, name: str, value: str) -> str:
        """A header's value as ``header_pairs`` has it (``name`` in lower case)."""
        if name in self.headers:
            return REDACTED
        if name in URL_HEADERS:
            return self.url(value)
        if name in LINK_HEADERS:
            return _LINK_TARGET.sub(lambda m: f"<{self.url(m[1])}>", value)
        if name in URL_PARAMETER_HEADERS:
            return _URL_PARAMETER.sub(lambda m: m[1] + self.url(m[2]), value)
        return value

    def url(self, url: str) -> str:
        """A URL (absolute or relative) with its query string redacted (:meth:`query`), and
        its user and password left out. So is a fragment's ``name=value`` list: an OAuth
        implicit grant returns its token there (``#access_token=...``)."""
        before, hash_, fragment = hide_credentials(url).partition("#")
        head, question, query = before.partition("?")
        if question:
            before = f"{head}?{self.query(query)}"
        return f"{before}{hash_}{self._fragment(fragment)}" if hash_ else before

    def _fragment(self, fragment: str) -> str:
        """A fragment with its parameters redacted as a query's are; those after a '?' too,
        as a single-page app's route has them (``#/callback?access_token=...``)."""
        route, question, query = fragment.partition("?")
        return f"{route}?{self.query(query)}" if question else self.query(fragment) or ""

    def argv(self, argv: Iterable[str]) -> list[str]:
        """Command-line arguments as a log keeps them: the value of an option named for a
        credential (``--api-key VALUE``, ``--password=VALUE``, ``token=VALUE``: a word of its
        name is a query parameter redacted here, or one of :data:`CREDENTIAL_WORDS`) or of a
        credential header given as ``NAME: VALUE`` (``--header=NAME: VALUE`` and
        ``-HNAME: VALUE`` too) redacted; URLs as :meth:`url` keeps them."""
        out: list[str] = []
        value_next = False
        for arg in argv:
            if value_next:  # (the value of the option before it)
                out.append(REDACTED)
                value_next = False
                continue
            name, equals, _ = arg.partition("=")
            if self._names_credential(name):
                out.append(f"{name}={REDACTED}" if equals else arg)
                value_next = not equals and name.startswith("-")
            else:
                out.append(self._header_arg(arg) or self.url(arg))
        return out

    def _header_arg(self, arg: str) -> str | None:
        """A credential header given in one argument (``NAME: VALUE``, or after a header
        option), with its value redacted; None for any other argument."""
        option = next((o for o in HEADER_OPTIONS if arg.startswith(o)), "")
        header, colon, _ = arg.removeprefix(option).partition(":")
        return f"{option}{header}: {REDACTED}" if colon and header.strip().lower() in self.headers else None

    def _names_credential(self, name: str) -> bool:
        """Whether an option's (or a setting's) name says that its value is a credential: the
        whole name, or one of its words (``--openai-api-key``, ``apiToken``), is a query
        parameter redacted here or one of :data:`CREDENTIAL_WORDS`."""
        bare = name.lstrip("-")
        if not bare or not bare.replace("-", "").replace("_", "").isalnum():
            return False
        words = {bare.lower(), *(w.lower() for w in _WORDS.findall(bare))}
        return not (words.isdisjoint(self.query_params) and words.isdisjoint(CREDENTIAL_WORDS))

    def query(self, raw: str | None) -> str | None:
        """A raw query string with the values of the chosen parameters replaced (names
        compared once percent-decoded); every other byte stays as it was."""
        if not raw or not self.query_params:
            return raw
        # Parameters are separated by '&' or, as many servers also read them, by ';'.
        parts = _QUERY_SEPARATORS.split(raw)
        for i in range(0, len(parts), 2):
            name, equals, value = parts[i].partition("=")
            if equals and value != REDACTED and not _name_readings(name).isdisjoint(self.query_params):
                parts[i] = f"{name}={REDACTED}"
        return "".join(parts)

    def json_bytes(self, body: bytes) -> bytes:
        """``body`` with the chosen JSON fields redacted (unchanged when none is present
        or when it is not JSON). JSON in UTF-16 or UTF-32 (RFC 7159 let it be) is read in
        its encoding; bytes that are no UTF-8 in a UTF-8 document are kept as they are."""
        if not self._paths or not body:
            return body
        encoding = _ENCODINGS.get(body[:4]) or _ENCODINGS.get(body[:2]) or json.detect_encoding(body)
        errors = "surrogateescape" if encoding.startswith("utf-8") else "strict"
        encoding = "utf-8" if encoding == "utf-8-sig" else encoding  # (json_text keeps the BOM)
        try:
            text = body.decode(encoding, errors)
        except UnicodeDecodeError:  # (a UTF-16 or 32 guess that was wrong)
            return UNREADABLE.encode() if _looks_like_json(body.decode("latin-1")) else body
        redacted = self.json_text(text)
        return body if redacted is text else redacted.encode(encoding, errors)

    def body_bytes(self, body: bytes, content_type: str | None) -> bytes:
        """A request body, or a response body that is not an event stream, as the log keeps
        it: its JSON fields redacted (:meth:`json_bytes`); a form's fields
        (``application/x-www-form-urlencoded``, ``multipart/form-data``) by name, as query
        parameters are: an OAuth token request sends ``password`` and ``client_secret`` so,
        and a token endpoint may answer ``access_token=...&token_type=bearer``. A form that
        cannot be read at all (a multipart body with no boundary to cut it at) is replaced
        whole. Other bodies cost a look at their Content-Type. ``body`` itself when nothing
        changed."""
        body = self.json_bytes(body)
        kind = form_type(content_type)
        if kind is None or not self.query_params:
            return body
        try:
            return self._form(body, kind, content_type or "")
        except Exception:  # a form that cannot be read cannot be redacted: none of it is kept
            return REDACTED.encode()

    def changes_body(self, content_type: str | None) -> bool:
        """Whether redaction may change a body of this Content-Type (a form's fields, or any
        body's JSON fields): it is then redacted whole, not stored chunk by chunk."""
        return bool(self._paths) or (form_type(content_type) is not None and bool(self.query_params))

    def _form(self, body: bytes, kind: FormType, content_type: str) -> bytes:
        """``body`` with its fields redacted; ``body`` itself when none is (its chunks are
        then stored as they came)."""
        if kind is FormType.URLENCODED:
            # Byte for byte; a name sent in UTF-8 bytes, not percent-escaped, is read as such.
            text = body.decode("utf-8", "surrogateescape")
            redacted = self.query(text) or text
            return body if redacted == text else redacted.encode("utf-8", "surrogateescape")
        form = multipart(body, content_type)
        if form is None:  # no boundary to read its fields by: it cannot be redacted
            return REDACTED.encode() if body else body
        secret = REDACTED.encode()
        hidden = [p.content != secret and p.hides(self.query_params) for p in form.parts]
        if not any(hidden):
            return body
        return form.joined(
            replace(p, content=secret) if h else p for p, h in zip(form.parts, hidden, strict=True)
        )

    def json_text(self, text: str) -> str:
        """Like :meth:`json_bytes` for text; returns ``text`` itself when nothing changed.

        Text that looks like JSON but cannot be read (cut off, malformed) might hold a
        value it should not: it is replaced by :data:`UNREADABLE`. JSON Lines are
        redacted line by line."""
        if not self._paths or not text:
            return text
        if text.startswith(_BOM):  # JSON behind a byte order mark is JSON all the same
            body = text[1:]
            rest = self.json_text(body)
            return text if rest is body else _BOM + rest
        try:
            return self._json_text(text)
        except RecursionError:
            # Read, but nested too deep to search or rebuild: it cannot be redacted, so none
            # of it is kept.
            return UNREADABLE

    def _json_text(self, text: str) -> str:
        try:
            doc = _load(text)
        except (ValueError, RecursionError):
            if "\n" in text.strip():
                return self._lines(text)
            return UNREADABLE if _looks_like_json(text) else text
        paths = self._paths_in(doc.value)
        secrets = [v for path in paths for v in _find(doc.value, path) if v != REDACTED and v is not None]
        if not secrets:
            return text
        if not doc.duplicate_keys and all(isinstance(v, str) for v in secrets):
            # A string literal keeps its quotes, so it cannot match inside another token.
            out = text
            for value in secrets:
                for literal in _literals(value):
                    out = out.replace(literal, json.dumps(REDACTED))
            if out != text and self._clean(out, secrets, paths):
                return out
        # Spelt differently (escapes, spacing), or a key given twice: rebuild the
        # document with every pointed-at value, and every copy of one, replaced.
        value = doc.value
        for path in paths:
            value = _replace(value, path)
        value = _scrub(value, {v for v in secrets if isinstance(v, str)})
        rebuilt = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        if _SURROGATE.search(rebuilt):  # a lone surrogate (\ud800 in the original): no UTF-8 spells it
            rebuilt = json.dumps(value, separators=(",", ":"))
        return rebuilt

    def _lines(self, text: str) -> str:
        """Text of several lines that is not one JSON document: JSON Lines (the last may be
        cut off), redacted line by line; or one document spread over lines that cannot be
        read (cut off, malformed), replaced whole: its lines that are no JSON by themselves
        (``"apiKey": "sk-...",``) hold its values."""
        lines = text.split("\n")
        last = max(i for i, line in enumerate(lines) if line.strip())
        if any(_broken(line) and (i < last or not _looks_like_json(line)) for i, line in enumerate(lines)):
            return UNREADABLE
        redacted = [self.json_text(line) for line in lines]
        return text if all(a is b for a, b in zip(lines, redacted, strict=True)) else "\n".join(redacted)

    def _paths_in(self, doc: Any) -> list[tuple[str, ...]]:
        """The pointers' paths, as they apply to ``doc``: in a JSON-RPC batch (an array of
        JSON-RPC messages) to each message too, so ``/params/apiKey`` reaches every one."""
        if _is_jsonrpc_batch(doc):
            return [*self._paths, *batch_forms(self._paths)]
        return self._paths

    @staticmethod
    def _clean(text: str, secrets: list[Any], paths: list[tuple[str, ...]]) -> bool:
        try:
            doc = _load(text)
        except (ValueError, RecursionError):
            return False
        strings = {v for v in secrets if isinstance(v, str)}
        return all(v in (REDACTED, None) for path in paths for v in _find(doc.value, path)) and not any(
            _strings(doc.value) & strings
        )


UNREADABLE = "[REDACTED: not readable as JSON]"
ANY_DEPTH = "**"
_BOM = "\ufeff"
_QUERY_SEPARATORS = re.compile(r"([&;])")
# A byte order mark's encoding, with its byte order: the mark is read as text and written back.
_ENCODINGS = {
    b"\xff\xfe\x00\x00": "utf-32-le",
    b"\x00\x00\xfe\xff": "utf-32-be",
    b"\xff\xfe": "utf-16-le",
    b"\xfe\xff": "utf-16-be",
}
_SURROGATE = re.compile("[\ud800-\udfff]")
# A line of a document spread over lines: a member (a key and its colon), or a closing bracket.
_MEMBER_OR_CLOSE = re.compile(r'\s*("(?:[^"\\]|\\.)*"\s*:|[}\]])')

# The user and password of a URL (``http://user:secret@agent``), up to its last '@'.
_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#\s]*@")


# The words of a name: ``apiToken`` is api, Token; ``OPENAI_API_KEY`` is OPENAI, API, KEY.
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z0-9]+(?![a-z])")


class FormType(StrEnum):
    """The media types of the request bodies that hold form fields."""

    URLENCODED = "application/x-www-form-urlencoded"
    MULTIPART = "multipart/form-data"


def form_type(content_type: str | None) -> FormType | None:
    """The form a body of this Content-Type holds; None for every other body."""
    media_type = (content_type or "").partition(";")[0].strip().lower()
    return FormType(media_type) if media_type in tuple(FormType) else None


@dataclass(frozen=True)
class Part:
    """What follows one delimiter of a ``multipart/form-data`` body: a field's ``head`` (the
    rest of the delimiter's line, its headers, the blank line), its ``content`` and its
    ``name``, with every reading of it a server may make (:func:`_readings`), in lower case.
    What is no field (the closing delimiter's ``--`` and all after it, a piece without a
    blank line) is all ``head``, with no name. A field whose headers cannot be read (the
    ``email`` package fails on them, or they pass :data:`MAX_PART_HEAD` or
    :data:`MAX_PART_PARAMETERS`) is not ``readable``: it has no name, and its content is
    redacted whatever it is called."""

    head: bytes
    content: bytes = b""
    name: str | None = None
    readings: frozenset[str] = frozenset()
    readable: bool = True

    def hides(self, names: frozenset[str]) -> bool:
        """Whether its content is redacted, given the (lower-case) names redacted."""
        return not (self.readable and self.readings.isdisjoint(names))


@dataclass(frozen=True)
class Multipart:
    """A ``multipart/form-data`` body cut at its delimiters, every byte kept."""

    preamble: bytes  # what precedes the first delimiter, after ``newline``
    parts: tuple[Part, ...]
    newline: bytes  # CRLF, or LF alone
    delimiter: bytes  # ``newline``, "--" and the boundary

    def joined(self, parts: Iterable[Part]) -> bytes:
        """The body again, of ``parts`` (these, or these changed)."""
        pieces = [self.preamble, *(part.head + part.content for part in parts)]
        return self.delimiter.join(pieces)[len(self.newline) :]


# The most bytes of a part's headers read, and the most parameters (each after a ';'):
# the email package's parameter and RFC 2047 parsing take time quadratic in them (a real
# part has a line or three of headers, and a name and a filename).
MAX_PART_HEAD = 8 * 1024
MAX_PART_PARAMETERS = 64


def multipart(body: bytes, content_type: str) -> Multipart | None:
    """``body`` cut at the delimiters of the Content-Type's boundary (an empty one too).
    Lines end in CRLF, or in LF alone when the first delimiter's does (some clients send
    that, and servers read it). None when the Content-Type names no boundary."""
    boundary = _boundary(content_type)
    if boundary is None:
        return None
    dash_boundary = b"--" + boundary
    newline = _newline(body, dash_boundary)
    delimiter = newline + dash_boundary
    # (A line break before the first delimiter, which may open the body, taken off in ``joined``.)
    preamble, *pieces = (newline + body).split(delimiter)
    return Multipart(preamble, tuple(_part(piece, newline) for piece in pieces), newline, delimiter)


def _newline(body: bytes, dash_boundary: bytes) -> bytes:
    """The line break of a multipart body: that of its first delimiter's line."""
    start = (b"\n" + body).find(b"\n" + dash_boundary)  # (where the delimiter starts in ``body``)
    end = body.find(b"\n", start) if start >= 0 else -1
    return b"\n" if end > 0 and body[end - 1 : end] != b"\r" else b"\r\n"


def _part(piece: bytes, newline: bytes) -> Part:
    """What follows a delimiter: a field, its content after the blank line that ends its
    headers; unless it is the closing delimiter or has no blank line."""
    line_end = piece.find(newline)
    blank = piece.find(newline * 2, max(line_end, 0))
    if piece.startswith(b"--") or line_end < 0 or blank < 0:
        return Part(piece)
    head = piece[: blank + 2 * len(newline)]
    content, headers = piece[len(head) :], head[line_end + len(newline) :]
    if len(headers) > MAX_PART_HEAD or headers.count(b";") > MAX_PART_PARAMETERS:
        return Part(head, content, readable=False)
    try:
        name, readings = _field(headers)
    except Exception:  # (TypeError, ValueError, UnicodeError...: all the email package raises)
        return Part(head, content, readable=False)
    return Part(head, content, name, readings)


def _field(headers: bytes) -> tuple[str | None, frozenset[str]]:
    """A part's field name and every reading of it, from its headers' Content-Disposition
    (its parameters parsed once)."""
    # Read a character a byte: a name sent in UTF-8 bytes (as browsers send it) keeps them.
    message = HeaderParser(policy=compat32).parsestr(headers.decode("latin-1"))
    params = message.get_params(header="content-disposition") or []
    given = [v for k, v in params if k.lower() == "name"]
    readings = frozenset(r.lower() for value in given for r in _readings(value))
    return (_field_name(given[0]) if given else None), readings


# A Content-Disposition parameter as ``email`` reads it: RFC 2231's (``name*=``) as its
# charset, language and text.
Parameter = str | tuple[str | None, str | None, str]


def _field_name(value: Parameter) -> str:
    """A field's name: RFC 2231's in its charset, the bytes of any other in UTF-8 (those
    that are not kept as escapes)."""
    if isinstance(value, tuple):
        return collapse_rfc2231_value(value)
    return value.encode("latin-1").decode("utf-8", "surrogateescape")


def _readings(value: Parameter) -> set[str]:
    """The names a field's ``name`` (or RFC 2231's ``name*``) parameter may be read as:
    its bytes in UTF-8 or Latin-1, or in the charset ``name*`` says; the RFC 2047 words
    some clients send (``=?UTF-8?B?...?=``) decoded. Any of them may be the name the
    server reads."""
    charset, text = (value[0], value[2]) if isinstance(value, tuple) else (None, value)
    raw = text.encode("latin-1")  # (a character a byte, as read)
    readings = {raw.decode("latin-1"), *_decoded(raw, "utf-8"), *_decoded(raw, charset)}
    if "=?" in text:
        readings.update(_encoded_words(text))
    return readings


def _decoded(raw: bytes, charset: str | None) -> list[str]:
    """``raw`` in ``charset``; none when it is not (or names no codec)."""
    try:
        return [raw.decode(charset)] if charset else []
    except (LookupError, UnicodeDecodeError):
        return []


def _encoded_words(text: str) -> list[str]:
    """``text`` with its RFC 2047 encoded words decoded; none when it cannot be."""
    try:
        pieces = decode_header(text)
    except HeaderParseError:
        return []
    # (What is no encoded word comes back as bytes too: a character a byte, as read.)
    decoded = [[p] if isinstance(p, str) else _decoded(p, charset or "latin-1") for p, charset in pieces]
    return ["".join(d[0] for d in decoded)] if all(decoded) else []


def _name_readings(name: str) -> set[str]:
    """A query parameter's or a form field's name as a server may read it, percent-decoded,
    in lower case: in UTF-8, or, when it is not ASCII, in Latin-1 too (what a form of a
    page served in ISO-8859-1 sends: ``p%E4sswort``, or the byte itself)."""
    plain = unquote_plus(name)
    if plain.isascii():
        return {plain.lower()}
    spelt = unquote_to_bytes(name.replace("+", " ").encode("utf-8", "surrogateescape"))
    return {plain.lower(), spelt.decode("latin-1").lower(), spelt.decode("utf-8", "replace").lower()}


def batch_forms(paths: Iterable[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """JSON pointers' paths as they apply to each message of a JSON-RPC batch (``*`` the
    message's index)."""
    return [("*", *path) for path in paths]


def _boundary(content_type: str) -> bytes | None:
    """A Content-Type's boundary, unquoted, as the bytes the body spells it in: the
    header's own (read as UTF-8, undecodable bytes escaped), or those an RFC 2231 value
    (``boundary*=utf-8''%E2%82%AC``) percent-encodes. None when there is none, or when no
    bytes spell the header."""
    try:
        raw = content_type.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return None
    message = Message()
    message["content-type"] = raw.decode("latin-1")  # (a character a byte, each kept)
    value = message.get_param("boundary")
    if value is None:
        return None
    return (value[2] if isinstance(value, tuple) else value).encode("latin-1")


def _is_jsonrpc_batch(doc: Any) -> bool:
    """Whether ``doc`` is a JSON-RPC batch: an array of objects, each with ``jsonrpc``."""
    return isinstance(doc, list) and bool(doc) and all(isinstance(m, dict) and "jsonrpc" in m for m in doc)


def hide_credentials(text: str) -> str:
    """``text`` with the user and password of every URL in it left out: an upstream given
    as ``http://user:secret@agent`` is shown and stored as ``http://agent``."""
    return _USERINFO.sub(r"\1", text)


class _Doc:
    __slots__ = ("duplicate_keys", "value")

    def __init__(self, value: Any, duplicate_keys: bool) -> None:
        self.value, self.duplicate_keys = value, duplicate_keys


def _load(text: str) -> _Doc:
    """Parse exactly (the standard library: big integers stay integers), noting a key
    given twice in one object (readers keep only the last one)."""
    duplicates = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal duplicates
        obj = dict(items)
        duplicates |= len(obj) != len(items)
        return obj

    return _Doc(json.loads(text, object_pairs_hook=pairs), duplicates)


def _broken(line: str) -> bool:
    """Whether a line is JSON, or a piece of a JSON document, that cannot be read."""
    if not (_looks_like_json(line) or _MEMBER_OR_CLOSE.match(line)):
        return False
    try:
        _load(line)
    except (ValueError, RecursionError):
        return True
    return False


def _looks_like_json(text: str) -> bool:
    stripped = text.lstrip()
    return stripped.startswith("{") or (
        stripped.startswith("[") and stripped[1:2] in '{["-0123456789tfn] \t\r\n'
    )


def _strings(node: Any) -> set[str]:
    if isinstance(node, str):
        return {node}
    if isinstance(node, dict):
        return set().union(*(_strings(v) | {k} for k, v in node.items())) if node else set()
    if isinstance(node, list):
        return set().union(*(_strings(v) for v in node)) if node else set()
    return set()


def _scrub(node: Any, secrets: set[str]) -> Any:
    """Every string (key or value) equal to a secret, replaced."""
    if isinstance(node, str):
        return REDACTED if node in secrets else node
    if isinstance(node, dict):
        return {(REDACTED if k in secrets else k): _scrub(v, secrets) for k, v in node.items()}
    if isinstance(node, list):
        return [_scrub(v, secrets) for v in node]
    return node


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """A JSON pointer's parts; ``*`` stands for every key or index at its level, ``**``
    for any depth (``/**/apiKey``: an ``apiKey`` wherever it appears)."""
    if pointer and not pointer.startswith("/"):
        raise UsageError(f"not a JSON pointer (it must start with '/'): {pointer!r}")
    parts = tuple(p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:])
    if parts and parts[-1] == ANY_DEPTH:
        raise UsageError(f"{pointer!r} ends with '**', which would redact everything: name a field after it")
    return parts


def _children(node: Any, key: str) -> Iterator[tuple[Any, Any]]:
    """(container key, child) pairs that ``key`` selects in ``node``."""
    if isinstance(node, dict):
        if key == "*":
            yield from node.items()
        elif key in node:
            yield key, node[key]
    elif isinstance(node, list):
        if key == "*":
            yield from enumerate(node)
        elif key.isdigit() and int(key) < len(node):
            yield int(key), node[int(key)]


def _find(node: Any, path: tuple[str, ...]) -> Iterator[Any]:
    if not path:
        yield node
        return
    if path[0] == ANY_DEPTH:  # here, or in anything below
        yield from _find(node, path[1:])
        for _, child in _children(node, "*"):
            yield from _find(child, path)
        return
    for _, child in _children(node, path[0]):
        yield from _find(child, path[1:])


def _replace(node: Any, path: tuple[str, ...]) -> Any:
    if not path:
        return REDACTED
    if path[0] == ANY_DEPTH:
        node = _replace(node, path[1:])
        for key, child in list(_children(node, "*")):
            node[key] = _replace(child, path)
        return node
    for key, child in list(_children(node, path[0])):
        node[key] = _replace(child, path[1:])
    return node


def _literals(value: Any) -> list[str]:
    """The usual spellings of ``value`` in a JSON document."""
    spellings = {
        json.dumps(value),
        json.dumps(value, ensure_ascii=False),
        json.dumps(value, separators=(",", ":")),
        json.dumps(value, ensure_ascii=False, separators=(",", ":")),
    }
    return sorted(spellings, key=len, reverse=True)
