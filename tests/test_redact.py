"""Redaction rules, and the writer applying them to everything it stores."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import sys
import zlib
from itertools import pairwise
from pathlib import Path
from types import FrameType

import pytest
from a2a_frames import completed_run, sse
from aiohttp import web
from click.testing import CliRunner
from conftest import RecordFactory, Recording, Serve

from tasktape.cli import main
from tasktape.errors import UsageError
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.redact import REDACTED, UNREADABLE, Redactor, parse_pointer
from tasktape.proxy.recorder import Refusal
from tasktape.replay import ReplayServer, load

SECRET = "sk-live-0123456789"


def test_headers_by_name_case_insensitive() -> None:
    r = Redactor(headers=["X-Tenant-Token"])
    pairs = [
        ("Authorization", "Bearer x"),
        ("cookie", "a=b"),
        ("X-TENANT-TOKEN", "t"),
        ("A2A-Version", "1.0"),
    ]
    assert r.header_pairs(pairs) == [
        ("Authorization", REDACTED),
        ("cookie", REDACTED),
        ("X-TENANT-TOKEN", REDACTED),
        ("A2A-Version", "1.0"),
    ]
    assert Redactor(defaults=False).header_pairs([("Authorization", "x")]) == [("Authorization", "x")]


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        (
            {"Authorization": "Bearer x"},
            "a list of (name, value) pairs, not dict: pass list(headers.items())",
        ),
        ({"TE": "gzip"}, "a list of (name, value) pairs, not dict: pass list(headers.items())"),
        ("Authorization", "a list of (name, value) pairs, not str"),
        ([("Authorization",)], "(name, value) pairs of strings, not ('Authorization',)"),
        ([("Referer", None)], "(name, value) pairs of strings, not ('Referer', None)"),
    ],
    ids=["dict", "dict of two-letter names", "one name", "a name alone", "no value"],
)
def test_headers_not_given_as_pairs_say_what_to_pass(headers: object, said: str) -> None:
    """A dict raised ValueError (too many values to unpack), or, its names two letters
    long, was read as pairs of their letters, without a word."""
    with pytest.raises(UsageError, match=re.escape(f"the headers are {said}")):
        Redactor().header_pairs(headers)  # type: ignore[arg-type]
    pairs = (("Authorization", "Bearer x"), ("Accept", "*/*"))  # a tuple, or any iterable, will do
    assert Redactor().header_pairs(iter(pairs)) == [("Authorization", REDACTED), ("Accept", "*/*")]


def test_query_parameters_by_name_the_rest_byte_for_byte() -> None:
    r = Redactor(query=["Team_Token"])
    raw = "lang=en&key=AIza-1&API%5FKEY=2&team_token=t&Token&sig=&x=a%26b&access_token=3&key=4"
    assert r.query(raw) == (
        "lang=en&key=[REDACTED]&API%5FKEY=[REDACTED]&team_token=[REDACTED]&Token&sig=[REDACTED]"
        "&x=a%26b&access_token=[REDACTED]&key=[REDACTED]"
    )
    assert r.query(r.query(raw)) == r.query(raw)
    plain = "lang=en&page=2"
    assert r.query(plain) == plain and r.query(None) is None and r.query("") == ""
    assert Redactor(defaults=False).query("key=1") == "key=1"
    assert Redactor(query=["page"], defaults=False).query("key=1&page=2") == "key=1&page=[REDACTED]"


def test_urls_in_headers_keep_their_query_string_redacted() -> None:
    r = Redactor(query=["team_token"])
    pairs = [
        ("Referer", "https://app.example/chat?lang=en&key=AIza-1#top"),
        ("location", "/tasks/t-1?token=abc&page=2"),
        ("Content-Location", "/tasks/t-1?team_token=t"),
        ("Link", '</next?page=3&key=1>; rel="next", <https://a.example/p?sig=s>; anchor="<x?key=2>"'),
        ("Link", "<>; rel=self, </plain>; rel=up"),
        ("Location", "/tasks/t-1"),
        ("Location", f"https://bob:{SECRET}@elsewhere.example/x?token=t&a=1"),
        ("Refresh", f"0; url=https://bob:{SECRET}@a.example/next?token={SECRET}"),
        ("refresh", "5; URL='/next?page=2&sig=s'"),
        ("Refresh", "30"),
    ]
    assert r.header_pairs(pairs) == [
        ("Referer", "https://app.example/chat?lang=en&key=[REDACTED]#top"),
        ("location", "/tasks/t-1?token=[REDACTED]&page=2"),
        ("Content-Location", "/tasks/t-1?team_token=[REDACTED]"),
        (
            "Link",
            '</next?page=3&key=[REDACTED]>; rel="next", <https://a.example/p?sig=[REDACTED]>;'
            ' anchor="<x?key=[REDACTED]>"',
        ),
        ("Link", "<>; rel=self, </plain>; rel=up"),
        ("Location", "/tasks/t-1"),
        ("Location", "https://elsewhere.example/x?token=[REDACTED]&a=1"),
        ("Refresh", "0; url=https://a.example/next?token=[REDACTED]"),
        ("refresh", "5; URL='/next?page=2&sig=[REDACTED]'"),
        ("Refresh", "30"),
    ]
    assert Redactor(defaults=False).url("/x?key=1") == "/x?key=1"


def test_writer_redacts_the_query_string(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with LogWriter(db, redactor=Redactor(query=["tenant"])) as w:
        ex = w.begin_exchange(
            w.begin_capture(source="test"),
            method="GET",
            path="/v1/tasks",
            query=f"key={SECRET}&tenant={SECRET}&pageSize=10",
        )
        w.end_exchange(ex, duration_ns=1)
    assert_secret_nowhere(db)
    with EventLog(db) as log:
        assert log.exchange(ex)["query"] == "key=[REDACTED]&tenant=[REDACTED]&pageSize=10"


def test_json_pointer_keeps_formatting() -> None:
    r = Redactor(json_pointers=["/params/metadata/apiKey"])
    body = '{"jsonrpc": "2.0",\n  "params": {"metadata": {"apiKey": "SECRET", "x": 1}}}'.replace(
        "SECRET", SECRET
    )
    assert r.json_text(body) == body.replace(f'"{SECRET}"', f'"{REDACTED}"')
    untouched = '{"params": {}}'
    assert r.json_text(untouched) is untouched
    assert r.json_text("not json") == "not json"


def test_wildcards_escapes_and_every_copy() -> None:
    r = Redactor(json_pointers=["/*/metadata/a~1b", "/list/*/token"])
    doc = {"task": {"metadata": {"a/b": SECRET}}, "list": [{"token": "t1"}, {"token": "t2"}], "echo": SECRET}
    out = json.loads(r.json_text(json.dumps(doc)))
    assert out == {
        "task": {"metadata": {"a/b": REDACTED}},
        "list": [{"token": REDACTED}, {"token": REDACTED}],
        "echo": REDACTED,
    }


def test_values_spelt_differently_are_replaced_structurally() -> None:
    r = Redactor(json_pointers=["/key", "/n"])
    escaped = '{"key": "sk\\u002dlive", "n": 12345, "m": 12345}'
    out = r.json_text(escaped)
    assert json.loads(out) == {"key": REDACTED, "n": REDACTED, "m": 12345}
    assert "sk" not in out and "12345" in out  # numbers are never replaced textually


def test_bad_pointer() -> None:
    with pytest.raises(ValueError, match="must start with '/'"):
        parse_pointer("params/key")


def record(
    db: Path,
    redactor: Redactor,
    chunks: list[bytes],
    *,
    is_sse: bool = True,
    encoding: str | None = None,
    request_body: bytes | None = None,
    max_body: int = 1 << 20,
) -> int:
    with LogWriter(db, redactor=redactor, max_body=max_body) as w:
        ex = w.begin_exchange(
            w.begin_capture(source="test"),
            method="POST",
            path="/message:stream",
            request_headers=[("Authorization", f"Bearer {SECRET}"), ("A2A-Version", "1.0")],
            request_body=request_body,
        )
        w.response_head(
            ex,
            status=200,
            headers=[("Set-Cookie", f"s={SECRET}")],
            is_sse=is_sse,
            ttfb_ns=1,
            content_encoding=encoding,
        )
        for i, chunk in enumerate(chunks):
            w.chunk(ex, i + 1, chunk)
        w.end_exchange(ex, duration_ns=len(chunks) + 1)
    return ex


def assert_secret_nowhere(db: Path) -> None:
    for path in db.parent.iterdir():
        assert SECRET.encode() not in path.read_bytes(), path


def test_writer_redacts_headers_bodies_events_and_chunks(tmp_path: Path) -> None:
    frames = completed_run()
    frames[0]["task"]["metadata"] = {"apiKey": SECRET}
    stream = b"".join(sse(frames, ids="e"))
    # Chunks cut anywhere, so the secret is split across two of them.
    cut = stream.index(SECRET.encode()) + 4
    chunks = [stream[:100], stream[100:cut], stream[cut : cut + 50], stream[cut + 50 :]]
    body = json.dumps({"message": {"metadata": {"apiKey": SECRET}, "parts": []}}).encode()
    db = tmp_path / "log.db"
    ex = record(
        db,
        Redactor(json_pointers=["/task/metadata/apiKey", "/message/metadata/apiKey"]),
        chunks,
        request_body=body,
    )
    assert_secret_nowhere(db)
    with EventLog(db) as log:
        x = log.exchange(ex)
        assert json.loads(x["request_headers"])[0] == ["Authorization", REDACTED]
        assert json.loads(x["response_headers"]) == [["Set-Cookie", REDACTED]]
        assert json.loads(x["request_body"])["message"]["metadata"]["apiKey"] == REDACTED
        events = log.events(ex)
        assert json.loads(events[0]["data"])["task"]["metadata"]["apiKey"] == REDACTED
        assert [e["event_id"] for e in events] == [f"e{n}" for n in range(1, 11)]
        # The stored chunks are the stream with the secret replaced; untouched events
        # keep their chunk boundaries.
        assert log.body(ex) == stream.replace(SECRET.encode(), REDACTED.encode())
        assert [c["data"] for c in log.chunks(ex)][-1] == chunks[-1]


def test_without_json_rules_chunks_are_stored_as_received(tmp_path: Path) -> None:
    stream = b"".join(sse(completed_run(), ids="e"))
    chunks = [stream[i : i + 37] for i in range(0, len(stream), 37)]
    db = tmp_path / "log.db"
    ex = record(db, Redactor(), chunks)
    with EventLog(db) as log:
        assert [c["data"] for c in log.chunks(ex)] == chunks


def test_non_streamed_json_body_redacted_whole(tmp_path: Path) -> None:
    body = json.dumps({"task": {"id": "t", "metadata": {"apiKey": SECRET}}}).encode()
    db = tmp_path / "log.db"
    ex = record(db, Redactor(json_pointers=["/task/metadata/apiKey"]), [body[:20], body[20:]], is_sse=False)
    assert_secret_nowhere(db)
    with EventLog(db) as log:
        assert json.loads(log.exchange(ex)["response_body"])["task"]["metadata"]["apiKey"] == REDACTED
        assert log.body(ex) == body.replace(SECRET.encode(), REDACTED.encode())


def test_compressed_bodies_are_stored_decoded(tmp_path: Path) -> None:
    stream = b"".join(sse(completed_run(), ids="e"))
    packed = gzip.compress(stream)
    db = tmp_path / "log.db"
    ex = record(db, Redactor(), [packed[i : i + 50] for i in range(0, len(packed), 50)], encoding="gzip")
    with EventLog(db) as log:
        x = log.exchange(ex)
        assert (x["body_encoding"], x["error"]) == ("gzip", None)
        assert log.body(ex) == stream and len(log.events(ex)) == 10
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    deflated = raw.compress(b'{"ok": 1}') + raw.flush()
    ex = record(tmp_path / "d.db", Redactor(), [deflated], is_sse=False, encoding="deflate")
    with EventLog(tmp_path / "d.db") as log:
        assert log.exchange(ex)["response_body"] == '{"ok": 1}'
    ex = record(tmp_path / "z.db", Redactor(), [b"\x00zstd"], is_sse=True, encoding="zstd")
    with EventLog(tmp_path / "z.db") as log:
        x = log.exchange(ex)
        assert x["body_encoding"] is None and "cannot decode Content-Encoding zstd" in x["error"]
        assert log.body(ex) == b"\x00zstd" and log.events(ex) == []


def test_non_streamed_bodies_are_capped(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    ex = record(db, Redactor(), [b"a" * 600, b"b" * 600], is_sse=False, max_body=1000)
    with EventLog(db) as log:
        x = log.exchange(ex)
        assert x["response_body_truncated"] == 1 and x["response_body"] == "a" * 600 + "b" * 400
        assert log.body(ex) == b"a" * 600 + b"b" * 400
    # Event streams are never capped.
    stream = b"".join(sse(completed_run()))
    ex = record(tmp_path / "s.db", Redactor(), [stream], max_body=10)
    with EventLog(tmp_path / "s.db") as log:
        assert log.body(ex) == stream and log.exchange(ex)["response_body_truncated"] == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A key given twice: readers keep the last value, the first must not survive.
        ('{"apiKey": "SECRET", "apiKey": "x"}', {"apiKey": REDACTED}),
        # Spelt with an escape at the pointer, plainly elsewhere: every copy goes.
        ('{"apiKey": "ESCAPED", "echo": "SECRET"}', {"apiKey": REDACTED, "echo": REDACTED}),
    ],
)
def test_redaction_leaves_no_copy(text: str, expected: dict) -> None:
    text = text.replace("ESCAPED", SECRET.replace("0", "\\u0030")).replace("SECRET", SECRET)
    out = Redactor(json_pointers=["/apiKey"]).json_text(text)
    assert json.loads(out) == expected and SECRET not in out


def test_what_cannot_be_read_is_not_kept() -> None:
    r = Redactor(json_pointers=["/apiKey"])
    cut = f'{{"apiKey": "{SECRET}", "more'
    assert r.json_text(cut) == UNREADABLE
    assert r.json_text("[DONE]") == "[DONE]" and r.json_text("plain text") == "plain text"
    lines = f'{{"apiKey": "{SECRET}"}}\n{{"ok": 1}}'
    assert r.json_text(lines) == '{"apiKey": "[REDACTED]"}\n{"ok": 1}'


def test_cut_and_truncated_bodies_leak_nothing(tmp_path: Path) -> None:
    redactor = Redactor(json_pointers=["/task/metadata/apiKey", "/message/metadata/apiKey"])
    body = json.dumps({"task": {"id": "t", "metadata": {"apiKey": SECRET}, "pad": "x" * 100}}).encode()
    # A JSON answer longer than max_body: what is kept cannot be parsed.
    record(tmp_path / "a.db", redactor, [body], is_sse=False, max_body=60)
    assert_secret_nowhere(tmp_path / "a.db")
    # A stream cut in the middle of the event that carries the secret.
    frame = b"".join(sse([{"task": {"id": "t", "metadata": {"apiKey": SECRET}}}]))
    record(tmp_path / "b.db", redactor, [frame[: len(frame) - 10]])
    assert_secret_nowhere(tmp_path / "b.db")


PRETTY = json.dumps({"apiKey": SECRET, "task": {"id": "t", "pad": "x" * 80}}, indent=2)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(PRETTY.encode()[:70], id="pretty-cut-mid-value"),
        pytest.param(PRETTY.encode()[: PRETTY.index("pad")], id="pretty-cut-after-a-line"),
        pytest.param(PRETTY.replace("}\n}", "},\n}").encode(), id="pretty-trailing-comma"),
        pytest.param(b"note:\n" + PRETTY.encode()[:70], id="text-then-pretty-cut"),
    ],
)
def test_a_document_spread_over_lines_that_cannot_be_read_is_not_kept(tmp_path: Path, body: bytes) -> None:
    """Only its first line looked like JSON: the lines after it, which hold the values,
    were kept as they were."""
    redactor = Redactor(json_pointers=["/apiKey"])
    assert redactor.json_bytes(body) == UNREADABLE.encode()
    ex = record(tmp_path / "a.db", redactor, [body], is_sse=False, request_body=body)
    assert_secret_nowhere(tmp_path / "a.db")
    # An event whose data lines spread one document, cut off by the stream's end.
    lines = "".join(f"data: {line}\n" for line in PRETTY.splitlines()[:3])
    record(tmp_path / "b.db", redactor, [f"event: message\n{lines}".encode()])
    assert_secret_nowhere(tmp_path / "b.db")
    with EventLog(tmp_path / "a.db") as log:
        assert log.exchange(ex)["request_body"] == UNREADABLE


def test_json_lines_and_text_around_json_keep_what_reads() -> None:
    r = Redactor(json_pointers=["/apiKey"])
    text = f'{{"apiKey": "{SECRET}"}}\n{{"ok": 1}}\n{{"apiKey": "{SECRET}", "cut'
    assert r.json_text(text) == f'{{"apiKey": "{REDACTED}"}}\n{{"ok": 1}}\n{UNREADABLE}'
    said = f'Answer:\n{{"apiKey": "{SECRET}"}}\n"Quoted" prose, and {{braces}} later\n'
    assert r.json_text(said) == said.replace(SECRET, REDACTED)


DOC = f'{{"apiKey":"{SECRET}","name":"café"}}'


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("latin-1", DOC.encode("latin-1")),  # in a UTF-8 document, a byte that is no UTF-8
        ("utf-16", DOC.encode("utf-16")),  # with a byte order mark, as RFC 7159 let JSON be
        ("utf-16-be", ("\ufeff" + DOC).encode("utf-16-be")),
        ("utf-32", DOC.encode("utf-32")),
    ],
    ids=["latin-1-byte", "utf-16", "utf-16-be", "utf-32"],
)
def test_json_that_is_not_utf_8_is_redacted_in_its_encoding(
    tmp_path: Path, encoding: str, body: bytes
) -> None:
    spelt = SECRET.encode({"utf-16": "utf-16-le", "utf-32": "utf-32-le"}.get(encoding, encoding))
    out = Redactor(json_pointers=["/apiKey"]).json_bytes(body)
    assert spelt in body and spelt not in out
    assert json.loads(out.decode(encoding).lstrip("\ufeff")) == {"apiKey": REDACTED, "name": "café"}
    assert out[:2] == body[:2]  # the byte order mark as it was
    record(tmp_path / "a.db", Redactor(json_pointers=["/apiKey"]), [body], is_sse=False, request_body=body)
    assert_secret_nowhere(tmp_path / "a.db")
    assert not any(spelt in path.read_bytes() for path in tmp_path.iterdir())


def test_a_lone_surrogate_beside_a_secret_spelt_with_escapes_loses_nothing(tmp_path: Path) -> None:
    """The document is rebuilt to redact the secret: a \\ud800 in it has no UTF-8, so it is
    written escaped (the log writer failed, and every row of its batch was lost)."""
    escaped = SECRET.replace("0", "\\u0030")
    body = f'{{"apiKey":"{escaped}","x":"\\ud800"}}'.encode()
    event = b"event: message\ndata: " + body + b"\n\n"
    db = tmp_path / "a.db"
    ex = record(db, Redactor(json_pointers=["/apiKey"]), [event], request_body=body)
    assert_secret_nowhere(db)
    with EventLog(db) as log:
        x = log.exchange(ex)
        assert json.loads(x["request_body"]) == {"apiKey": REDACTED, "x": "\ud800"}
        (e,) = log.events(ex)
        assert json.loads(e["data"]) == {"apiKey": REDACTED, "x": "\ud800"}


def test_a_redacted_header_is_no_session_id(tmp_path: Path) -> None:
    """An Mcp-Session-Id given to --redact-header: stored as redacted in the headers, it
    was the row's session_id as sent (the request's, or the one initialize answered with)."""
    db = tmp_path / "log.db"
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    with LogWriter(db, redactor=Redactor(headers=["Mcp-Session-Id"])) as w:
        capture = w.begin_capture(source="test")
        asked = w.begin_exchange(
            capture,
            method="POST",
            path="/mcp",
            request_headers=[("Mcp-Session-Id", SECRET)],
            request_body=body,
        )
        w.response_head(asked, status=202, headers=[], is_sse=False, ttfb_ns=1)
        w.end_exchange(asked, duration_ns=2)
        opened = w.begin_exchange(
            capture,
            method="POST",
            path="/mcp",
            request_headers=[("MCP-Protocol-Version", "2025-11-25")],
            request_body=body.replace(b"tools/list", b"initialize"),
        )
        w.response_head(opened, status=200, headers=[("mcp-session-id", SECRET)], is_sse=False, ttfb_ns=1)
        w.end_exchange(opened, duration_ns=2).result()
    assert_secret_nowhere(db)
    with EventLog(db) as log:
        assert [(x["protocol"], x["session_id"]) for x in log.exchanges()] == [("mcp", REDACTED)] * 2


def test_an_undecodable_body_is_withheld_when_fields_must_be_redacted(tmp_path: Path) -> None:
    ex = record(
        tmp_path / "z.db",
        Redactor(json_pointers=["/apiKey"]),
        [b"\x28\xb5\x2f\xfd compressed"],
        is_sse=False,
        encoding="zstd",
    )
    with EventLog(tmp_path / "z.db") as log:
        x = log.exchange(ex)
        assert log.chunks(ex) == [] and x["response_body"] is None
        assert "is not stored, since it could not be redacted" in x["error"]


def test_every_gzip_member_is_decoded(tmp_path: Path) -> None:
    frames = sse(completed_run(), ids="e")
    members = b"".join(gzip.compress(f) for f in frames)  # one member per event
    ex = record(
        tmp_path / "m.db",
        Redactor(),
        [members[i : i + 100] for i in range(0, len(members), 100)],
        encoding="gzip",
    )
    with EventLog(tmp_path / "m.db") as log:
        assert log.body(ex) == b"".join(frames) and len(log.events(ex)) == 10


async def test_a_url_fragment_s_parameters_are_redacted_as_a_query_s(record: RecordFactory) -> None:
    """An OAuth implicit grant redirects with the token in the fragment, which the log kept."""

    async def login(request: web.Request) -> web.Response:
        return web.Response(
            status=302,
            headers={
                "Location": f"https://app.example/cb#access_token={SECRET}&token_type=bearer",
                "Refresh": f"0; url=/next#/cb?access_token={SECRET}&state=s1",
                "Content-Location": "/login#top",
            },
        )

    app = web.Application()
    app.router.add_get("/login", login)
    rec = await record(app)
    async with rec.session.get(f"{rec.url}/login", allow_redirects=False) as r:
        assert r.status == 302 and SECRET in r.headers["Location"]  # the client sees it as sent
    with await rec.log() as log:
        (x,) = log.exchanges()
    assert json.loads(x["response_headers"])[:3] == [
        ["Location", f"https://app.example/cb#access_token={REDACTED}&token_type=bearer"],
        ["Refresh", f"0; url=/next#/cb?access_token={REDACTED}&state=s1"],
        ["Content-Location", "/login#top"],
    ]
    assert_secret_nowhere(rec.db)


def multipart(boundary: str, fields: list[tuple[str, str]]) -> bytes:
    """A multipart/form-data body as a browser sends it, the last field a file."""
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields[:-1]
    ]
    name, value = fields[-1]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="a.txt"\r\n'
        f"Content-Type: text/plain\r\n\r\n{value}\r\n--{boundary}--\r\n"
    )
    return "".join(parts).encode()


def receiving(path: str) -> tuple[web.Application, list[bytes]]:
    """An upstream answering POSTs to ``path``, and the bodies it received, as it received them."""
    received: list[bytes] = []

    async def answer(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post(path, answer)
    return app, received


async def test_form_fields_are_redacted_by_the_query_parameters_names(record: RecordFactory) -> None:
    """An OAuth token request sends the password and client secret as a form; a form
    posted as multipart/form-data the same. Other bodies are kept whatever they say."""
    app, received = receiving("/token")
    rec = await record(app, redactor=Redactor(query=["pin"]))
    form = (
        f"grant_type=password&username=ann&password={SECRET}&client_secret={SECRET};pin={SECRET}&scope=a%20b"
    )
    boundary = "----form7MA4YWxk"
    fields = [("username", "ann"), ("Password", f"{SECRET}\r\nsecond line"), ("note", "hi"), ("pin", SECRET)]
    sent = [
        (form.encode(), "application/x-www-form-urlencoded; charset=UTF-8"),
        (multipart(boundary, fields), f'multipart/form-data; boundary="{boundary}"'),
        (b"password=plain&client_secret=plain", "text/plain"),
    ]
    for body, content_type in sent:
        async with rec.session.post(
            f"{rec.url}/token", data=body, headers={"Content-Type": content_type}
        ) as r:
            assert r.status == 200
    assert received == [body for body, _ in sent]  # the agent got them as sent
    with await rec.log() as log:
        stored = [x["request_body"] for x in log.exchanges()]
    assert stored == [
        f"grant_type=password&username=ann&password={REDACTED}&client_secret={REDACTED};pin={REDACTED}"
        "&scope=a%20b",
        multipart(
            boundary, [("username", "ann"), ("Password", REDACTED), ("note", "hi"), ("pin", REDACTED)]
        ).decode(),
        "password=plain&client_secret=plain",
    ]
    assert_secret_nowhere(rec.db)


async def test_a_form_that_cannot_be_decoded_is_not_stored_by_default(record: RecordFactory) -> None:
    """A form under a Content-Encoding the log cannot decode (x-custom, zstd, or gzip on
    bytes that are no gzip) cannot have its fields redacted: with no redaction option given
    it was stored as sent, password and all. It is not stored; a body no redaction changes
    (plain text) is still kept as sent."""
    received: list[bytes] = []

    async def answer(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.json_response({"ok": True})

    app = web.Application(handler_args={"auto_decompress": False})  # (gzip that is no gzip, as sent)
    app.router.add_post("/token", answer)
    rec = await record(app)
    form = f"grant_type=password&password={SECRET}&client_secret={SECRET}".encode()
    boundary = "formB"
    sent = [
        (form, "application/x-www-form-urlencoded", "x-custom"),
        (form, "application/x-www-form-urlencoded", "gzip"),
        (
            multipart(boundary, [("user", "ann"), ("password", SECRET)]),
            f"multipart/form-data; boundary={boundary}",
            "zstd",
        ),
        (b"password=plain", "text/plain", "x-custom"),
    ]
    for body, content_type, encoding in sent:
        headers = {"Content-Type": content_type, "Content-Encoding": encoding}
        async with rec.session.post(f"{rec.url}/token", data=body, headers=headers) as r:
            assert r.status == 200
    assert received == [body for body, _, _ in sent]  # the agent got them as sent
    with await rec.log() as log:
        stored = [(x["request_body"], x["error"]) for x in log.exchanges()]
    withheld = "it is not stored, since it could not be redacted"
    assert [body for body, _ in stored] == [None, None, None, "password=plain"]
    assert [withheld in error for _, error in stored] == [True, True, True, False]
    assert "cannot decode Content-Encoding x-custom: it is stored as sent" in stored[3][1]
    assert_secret_nowhere(rec.db)


async def test_json_pointers_reach_every_message_of_a_json_rpc_batch(record: RecordFactory) -> None:
    """A batch is an array: ``/params/apiKey`` names no field of it, but one of each request."""
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"apiKey": f"{SECRET}-1", "id": "t1"}},
        {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"apiKey": f"{SECRET}-2", "id": "t2"}},
    ]

    async def rpc(request: web.Request) -> web.Response:
        calls = await request.json()
        return web.json_response([{"jsonrpc": "2.0", "id": c["id"], "result": c["params"]} for c in calls])

    app = web.Application()
    app.router.add_post("/rpc", rpc)
    rec = await record(app, redactor=Redactor(json_pointers=["/params/apiKey", "/result/apiKey"]))
    async with rec.session.post(f"{rec.url}/rpc", json=batch) as r:
        answer = await r.json()
    assert [a["result"]["apiKey"] for a in answer] == [f"{SECRET}-1", f"{SECRET}-2"]
    with await rec.log() as log:
        (x,) = log.exchanges()
    request, response = json.loads(x["request_body"]), json.loads(x["response_body"])
    assert [c["params"] for c in request] == [
        {"apiKey": REDACTED, "id": "t1"},
        {"apiKey": REDACTED, "id": "t2"},
    ]
    assert [a["result"] for a in response] == [
        {"apiKey": REDACTED, "id": "t1"},
        {"apiKey": REDACTED, "id": "t2"},
    ]
    assert_secret_nowhere(rec.db)


async def test_the_usual_token_headers_and_parameters_are_redacted_by_default(record: RecordFactory) -> None:
    async def anything(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/v1/models", anything)
    rec = await record(app)
    headers = {"X-Goog-Api-Key": SECRET, "X-Auth-Token": SECRET, "Private-Token": SECRET, "Accept": "*/*"}
    query = f"refresh_token={SECRET}&id_token={SECRET}&access-token={SECRET}&page=2"
    async with rec.session.get(f"{rec.url}/v1/models?{query}", headers=headers) as r:
        assert r.status == 200
    with await rec.log() as log:
        (x,) = log.exchanges()
    stored = dict(json.loads(x["request_headers"]))
    assert [stored[h] for h in headers] == [REDACTED, REDACTED, REDACTED, "*/*"]
    assert x["query"] == f"refresh_token={REDACTED}&id_token={REDACTED}&access-token={REDACTED}&page=2"
    assert_secret_nowhere(rec.db)


def test_a_command_line_s_credentials_are_redacted_however_given(tmp_path: Path) -> None:
    """Options curl and others take a credential with, and headers given in one argument."""
    argv = [
        *("agent", "--header=Authorization: Bearer " + SECRET, "-HAuthorization: Bearer " + SECRET),
        *("--header=Accept: text/plain", "-H", f"X-Auth-Token: {SECRET}", "--passwd", SECRET),
        *(f"--pw={SECRET}", "--credentials", SECRET, "--bearer", SECRET, "--verbose"),
    ]
    db = tmp_path / "log.db"
    with LogWriter(db) as w:
        capture = w.begin_capture(source="test", argv=argv)
    assert_secret_nowhere(db)
    with EventLog(db) as log:
        (row,) = log.captures()
    assert row["id"] == capture
    assert json.loads(row["argv"]) == [
        *("agent", f"--header=Authorization: {REDACTED}", f"-HAuthorization: {REDACTED}"),
        *("--header=Accept: text/plain", "-H", f"X-Auth-Token: {REDACTED}", "--passwd", REDACTED),
        *(f"--pw={REDACTED}", "--credentials", REDACTED, "--bearer", REDACTED, "--verbose"),
    ]


async def test_a_refused_connect_target_loses_its_user_and_password(record: RecordFactory) -> None:
    """``CONNECT user:password@host:443`` is all authority: logged and shown without them."""
    refusals: list[Refusal] = []
    rec = await record(web.Application(), on_refusal=refusals.append)
    host, port = rec.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"CONNECT bob:{SECRET}@evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n"
    writer.write(f"{head}Connection: close\r\n\r\n".encode())  # (else read() waits out the keep-alive)
    response = await reader.read()
    writer.close()
    assert response.startswith(b"HTTP/1.1 405") and b"CONNECT is not accepted" in response
    assert [(r.method, r.path) for r in refusals] == [
        ("CONNECT", "evil.example:443")
    ]  # what the console shows
    with await rec.log() as log:
        (x,) = log.exchanges()
    assert (x["path"], x["outcome"]) == ("evil.example:443", "refused")
    assert_secret_nowhere(rec.db)


def test_an_upstream_s_query_is_shown_redacted_in_its_usage_error(tmp_path: Path) -> None:
    upstream = f"http://bob:{SECRET}@agent.example/base?key={SECRET}&v=1"
    result = CliRunner().invoke(main, ["record", "--upstream", upstream, "--db", str(tmp_path / "x.db")])
    assert result.exit_code == 2
    assert f"'http://agent.example/base?key={REDACTED}&v=1'" in result.output
    assert SECRET not in result.output


async def test_a_multipart_body_of_any_boundary_is_kept_and_redacted(record: RecordFactory) -> None:
    """A boundary no Latin-1 spells (UTF-8 in the header, RFC 2231's ``boundary*=``, a byte
    that is no UTF-8) lost the whole exchange; lines ending in LF alone, or an empty
    boundary, kept the password. Each is stored, its password redacted."""
    app, received = receiving("/upload")
    rec = await record(app)
    host, port = rec.url.removeprefix("http://").split(":")

    def form(boundary: bytes, newline: bytes = b"\r\n") -> bytes:
        return newline.join(
            [
                b"--" + boundary,
                b'Content-Disposition: form-data; name="password"',
                b"",
                SECRET.encode(),
                b"--" + boundary + b"--",
                b"",
            ]
        )

    sent = [
        ("multipart/form-data; boundary=\u20ac".encode(), form("\u20ac".encode())),
        (b"multipart/form-data; boundary*=utf-8''%E2%82%AC", form("\u20ac".encode())),
        (b"multipart/form-data; boundary=\xff", form(b"\xff")),
        (b"multipart/form-data; boundary=B", form(b"B", b"\n")),
        (b'multipart/form-data; boundary=""', form(b"")),
    ]
    for content_type, body in sent:  # (the bytes as sent: no client library spells all of these)
        reader, writer = await asyncio.open_connection(host, int(port))
        head = (
            f"POST /upload HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
        )
        writer.write(head.encode() + b"Content-Type: " + content_type + b"\r\n\r\n" + body)
        response = await reader.read()
        writer.close()
        assert response.startswith(b"HTTP/1.1 200")
    await _kept_redacted(rec, [body for _, body in sent], received)


async def _kept_redacted(rec: Recording, sent: list[bytes], received: list[bytes]) -> None:
    """The agent got the request bodies as sent; the log keeps them with the secret
    redacted, and has it nowhere."""
    assert received == sent
    with await rec.log() as log:
        stored = [x["request_body"] for x in log.exchanges()]
    # (Stored as text when it is UTF-8, else as bytes.)
    assert [b if isinstance(b, bytes) else b.encode() for b in stored] == [
        body.replace(SECRET.encode(), REDACTED.encode()) for body in sent
    ]
    assert_secret_nowhere(rec.db)


async def test_a_form_field_named_in_any_spelling_of_a_non_ascii_name_is_redacted(
    record: RecordFactory,
) -> None:
    """``--redact-query pässwort``: a browser sends the name in UTF-8 bytes, other clients
    in RFC 2231's ``name*=`` (beside a plain name, or alone), in RFC 2047 words or in
    Latin-1; an urlencoded form may spell it unescaped, or in Latin-1. Each kept the password."""
    app, received = receiving("/signup")
    rec = await record(app, redactor=Redactor(query=["pässwort"]))

    def form(disposition: bytes) -> bytes:
        head = b"--B\r\nContent-Disposition: form-data; " + disposition + b"\r\n\r\n"
        rest = b'\r\n--B\r\nContent-Disposition: form-data; name="u"\r\n\r\nann\r\n--B--\r\n'
        return head + SECRET.encode() + rest

    dispositions = [
        'name="pässwort"'.encode(),
        b"name*=UTF-8''p%C3%A4sswort",
        b"name=\"password2\"; name*=utf-8''P%C3%84SSWORT",
        b'name="=?UTF-8?B?cMOkc3N3b3J0?="',
        'name="pässwort"'.encode("latin-1"),
    ]
    sent = [(form(d), "multipart/form-data; boundary=B") for d in dispositions]
    # Urlencoded: unescaped, escaped in UTF-8, and in Latin-1 (a page served in ISO-8859-1).
    for name in ("pässwort".encode(), b"p%C3%A4sswort", b"p%E4sswort", "pässwort".encode("latin-1")):
        sent.append((b"u=ann&" + name + f"={SECRET}".encode(), "application/x-www-form-urlencoded"))
    for body, content_type in sent:
        headers = {"Content-Type": content_type}
        async with rec.session.post(f"{rec.url}/signup", data=body, headers=headers) as r:
            assert r.status == 200
    await _kept_redacted(rec, [body for body, _ in sent], received)


async def test_a_form_answer_s_fields_are_redacted_as_a_form_request_s(
    record: RecordFactory, serve: Serve
) -> None:
    """An OAuth token endpoint may answer with a form (``access_token=...&token_type=...``,
    GitHub's by default): the log kept the token, where a form request's fields of the same
    names are redacted. A replay answers with the form as the log keeps it."""
    answer = f"access_token={SECRET}&scope=repo&session_key={SECRET}&token_type=bearer"

    async def token(request: web.Request) -> web.Response:
        return web.Response(text=answer, content_type="application/x-www-form-urlencoded")

    app = web.Application()
    app.router.add_post("/login/oauth/access_token", token)
    rec = await record(app, redactor=Redactor(query=["session_key"]))
    async with rec.session.post(f"{rec.url}/login/oauth/access_token", data=b"code=c1") as r:
        assert await r.text() == answer  # the client gets it as sent
    kept = f"access_token={REDACTED}&scope=repo&session_key={REDACTED}&token_type=bearer"
    with await rec.log() as log:
        (x,) = log.exchanges()
    assert x["response_body"] == kept
    assert_secret_nowhere(rec.db)
    replay = await serve(ReplayServer(load([rec.db]), speed=0).app)
    async with rec.session.post(f"{replay}/login/oauth/access_token", data=b"code=c1") as r:
        assert (r.status, r.content_type, await r.text()) == (200, "application/x-www-form-urlencoded", kept)


async def test_a_form_part_whose_name_cannot_be_read_is_redacted_and_its_siblings_still_are(
    record: RecordFactory,
) -> None:
    """One part whose Content-Disposition the email package fails on (a TypeError, a
    UnicodeError, a ValueError) left the whole form unredacted, its ``password`` field with
    it. That part's content is redacted, whatever it is called; its siblings are judged as
    usual. A multipart body whose Content-Type names no boundary cannot be read at all: none
    of it is kept."""
    app, received = receiving("/signup")
    rec = await record(app)

    def form(disposition: bytes) -> bytes:
        return (
            b"--B\r\nContent-Disposition: form-data; " + disposition + b"\r\n\r\nodd\r\n"
            b'--B\r\nContent-Disposition: form-data; name="u"\r\n\r\nann\r\n'
            b'--B\r\nContent-Disposition: form-data; name="password"\r\n\r\n'
            + SECRET.encode()
            + b"\r\n--B--\r\n"
        )

    dispositions = [
        b"name*0; name*",  # TypeError
        b"name*=idna''password",  # UnicodeError
        b"name*=punycode''%ff",
        b'name="=?idna?q?xn--a?="',
        b"name*=utf\x00-8''password",  # ValueError
    ]
    sent = [(form(d), "multipart/form-data; boundary=B") for d in dispositions]
    sent.append((form(b'name="note"'), "multipart/form-data"))
    for body, content_type in sent:
        headers = {"Content-Type": content_type}
        async with rec.session.post(f"{rec.url}/signup", data=body, headers=headers) as r:
            assert r.status == 200
    assert received == [body for body, _ in sent]  # the agent got them as sent
    with await rec.log() as log:
        stored = [x["request_body"] for x in log.exchanges()]
    assert [b if isinstance(b, bytes) else b.encode() for b in stored] == [
        *(
            body.replace(b"\r\n\r\nodd", b"\r\n\r\n" + REDACTED.encode()).replace(
                SECRET.encode(), REDACTED.encode()
            )
            for body, _ in sent[:-1]
        ),
        REDACTED.encode(),
    ]
    assert_secret_nowhere(rec.db)


def email_package_calls(body: bytes, content_type: str) -> int:
    """How many calls the email package makes (its functions, and the builtins they call)
    while ``body`` is redacted: the work its parsing takes."""
    calls = 0

    def count(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        calls += "email" in Path(frame.f_code.co_filename).parts

    sys.setprofile(count)
    try:
        Redactor().body_bytes(body, content_type)
    finally:
        sys.setprofile(None)
    return calls


def test_a_form_part_s_headers_cost_bounded_work() -> None:
    """A name of 200,000 RFC 2047 words (4 MB) took the writer 46 s, 200,000 ``name``
    parameters 31 s: the email package's parsing is quadratic in them. Headers past the
    bound are not read: the part is redacted, at no more cost than a part of one word."""
    content_type = "multipart/form-data; boundary=B"

    def form(disposition: bytes) -> bytes:
        head = b"--B\r\nContent-Disposition: form-data; " + disposition + b"\r\n\r\n"
        return (
            head
            + SECRET.encode()
            + b'\r\n--B\r\nContent-Disposition: form-data; name="u"\r\n\r\nann\r\n--B--\r\n'
        )

    word = b"=?utf-8?b?cGFzcw==?="  # "pass"
    one_word = email_package_calls(form(b'name="' + word + b'"'), content_type)
    for disposition in (b'name="' + word * 20_000 + b'"', b'name="tok"; ' * 5_000):
        body = form(disposition)
        assert Redactor().body_bytes(body, content_type) == body.replace(SECRET.encode(), REDACTED.encode())
        assert email_package_calls(body, content_type) <= one_word


async def test_a_form_answer_keeps_its_chunks_unless_a_field_is_redacted(record: RecordFactory) -> None:
    """A form answer was always stored as one chunk at the last chunk's moment, even with
    no field redacted: a replay sent it all at once at the end. Unredacted, it keeps its
    chunks and their moments; with a field redacted, it is one chunk."""
    pieces = [b"scope=repo", b"&state=s1", b"&page=2", b"&lang=en", b"&token_type=bearer"]

    async def token(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-www-form-urlencoded"})
        await response.prepare(request)
        secret = [f"&access_token={SECRET}".encode()] if request.query.get("secret") else []
        for piece in [*pieces, *secret]:
            await response.write(piece)
            await asyncio.sleep(0.05)
        return response

    app = web.Application()
    app.router.add_get("/token", token)
    rec = await record(app)
    for query in ("", "?secret=1"):
        async with rec.session.get(f"{rec.url}/token{query}") as r:
            assert r.status == 200 and await r.read()
    with await rec.log() as log:
        plain, redacted = (
            [(c["offset_ns"], c["data"]) for c in log.chunks(x["id"])] for x in log.exchanges()
        )
    assert [data for _, data in plain] == pieces
    offsets = [offset for offset, _ in plain]
    assert all(a < b for a, b in pairwise(offsets))  # each at its own moment (how far apart, load decides)
    assert [data for _, data in redacted] == [b"".join(pieces) + f"&access_token={REDACTED}".encode()]
    assert_secret_nowhere(rec.db)
