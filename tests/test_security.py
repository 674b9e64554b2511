"""tasktape's security promises, tested as an attacker or a careless user would find them:
secrets never reach the log, its cassettes or the inspector's pages; the recorder is not an
open proxy; everything listens on loopback unless told otherwise, and says so loudly; the
inspector cannot write; a cassette path cannot leave the test suite's folder; content an
agent streams cannot script the inspector's pages."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from a2a_frames import artifact, completed_run, sse, status, task
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner
from conftest import RecordFactory
from loopback import in_thread, running, stop

from tasktape.cli import main
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.cassette import read_cassette
from tasktape.eventlog.recorded import from_log
from tasktape.inspector.app import create_datasette
from tasktape.replay.modes import ReplayMode
from tasktape.replay.server import ReplayServer
from tasktape.serving import start_site

ROOT = Path(__file__).resolve().parent.parent
# One secret per way in, so a leak says which way it came.
SECRETS = {
    "Authorization": "sk-authorization-4f1c9e",
    "Cookie": "sk-cookie-8a2d71",
    "X-API-Key": "sk-api-key-c03b55",
    "X-Team-Secret": "sk-team-header-91e0aa",  # redacted because the command line says so
    "request JSON": "sk-request-json-5d3f20",
    "event JSON": "sk-event-json-77b4c8",
    "Set-Cookie": "sk-set-cookie-e6a913",
    "upstream password": "sk-upstream-password-2b8f6d",
    "query key": "sk-query-key-0d5e17",  # a parameter redacted by default
    "query parameter": "sk-query-team-3c9a40",  # redacted because the command line says so
    "Referer query": "sk-referer-key-a61f08",  # a URL header's query parameter
    "Content-Location query": "sk-content-location-5e02bd",
    "Link query": "sk-link-page-token-93c1e7",  # a paging link's token
}
REDACT = [
    "--redact-header",
    "X-Team-Secret",
    "--redact-query",
    "team_token",
    "--redact-json",
    "/message/metadata/apiKey",
    "--redact-json",
    "/statusUpdate/metadata/connectorToken",
]
HEADERS = {
    "Authorization": f"Bearer {SECRETS['Authorization']}",
    "Cookie": f"session={SECRETS['Cookie']}",
    "X-API-Key": SECRETS["X-API-Key"],
    "X-Team-Secret": SECRETS["X-Team-Secret"],
    "A2A-Version": "1.0",
    "Referer": f"https://app.example/chat?lang=en&key={SECRETS['Referer query']}",
}
QUERY = f"lang=en&key={SECRETS['query key']}&team_token={SECRETS['query parameter']}"
REQUEST = {
    "message": {
        "role": "ROLE_USER",
        "parts": [{"text": "What does J45.909 mean?"}],
        "metadata": {"apiKey": SECRETS["request JSON"]},
    }
}


def leaked(data: bytes | str, where: str) -> list[str]:
    """Which secrets ``data`` holds, each named with ``where``."""
    raw = data.encode() if isinstance(data, str) else data
    return [f"{name} in {where}" for name, secret in SECRETS.items() if secret.encode() in raw]


def log_files(db: Path) -> list[Path]:
    """The log and its WAL and shared-memory files, as they are now."""
    return [p for p in db.parent.iterdir() if p.name.startswith(db.name)]


def secrets_agent(seen: list[dict[str, str]]) -> web.Application:
    """An agent that checks it gets the credentials, and streams a secret back."""
    frames = completed_run()
    frames[1]["statusUpdate"]["metadata"] = {"connectorToken": SECRETS["event JSON"]}

    async def stream(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        if request.query.get("key") != SECRETS["query key"]:
            raise web.HTTPUnauthorized(text="the key in the query string is missing or wrong")
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Set-Cookie": f"s={SECRETS['Set-Cookie']}",
                "Content-Location": f"/tasks/t-1?token={SECRETS['Content-Location query']}",
                "Link": f'</tasks?page=2&token={SECRETS["Link query"]}>; rel="next"',
            }
        )
        await response.prepare(request)
        for frame in sse(frames, ids="e"):
            await response.write(frame)
        return response

    app = web.Application()
    app.router.add_post("/message:stream", stream)
    return app


@asynccontextmanager
async def agent_with_password(seen: list[dict[str, str]]) -> AsyncIterator[str]:
    """The secrets agent on loopback; its URL carries a user and password."""
    server = TestServer(secrets_agent(seen), host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://agent:{SECRETS['upstream password']}@127.0.0.1:{server.port}"
    finally:
        await server.close()


@asynccontextmanager
async def tasktape(*args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str, list[str]]]:
    """A ``tasktape`` command serving on a port of its own: the process, its URL, and what it
    printed (stdout, then stderr once it ended). Stopped with SIGTERM, killed if need be."""
    async with running(*args) as run:
        yield run.proc, run.url, run.printed
        assert await stop(run) == 0, run.printed


async def committed(db: Path, exchanges: int) -> None:
    """Wait until ``exchanges`` exchanges have ended in the log (a recorder commits within ms)."""
    async with asyncio.timeout(20):
        while True:
            if db.exists():
                with EventLog(db) as log:
                    if sum(x["outcome"] is not None for x in log.exchanges()) >= exchanges:
                        return
            await asyncio.sleep(0.05)


async def send(url: str, session: aiohttp.ClientSession) -> bytes:
    async with session.post(f"{url}/message:stream?{QUERY}", json=REQUEST, headers=HEADERS) as r:
        assert r.status == 200
        return await r.read()


async def inspector_pages(db: Path) -> dict[str, str]:
    """Every page of the inspector that shows what the log holds, as served."""
    ds = create_datasette(db)
    name = db.stem
    with EventLog(db) as log:
        exchanges = [x["id"] for x in log.exchanges()]
        tasks = sorted({x["task_id"] for x in log.exchanges() if x["task_id"]})
    paths = [f"/{name}/{table}" for table in ("captures", "exchanges", "chunks", "events", "findings")]
    paths += [
        f"/{name}/{view}" for view in ("task_summary", "task_timeline", "task_artifacts", "exchange_metrics")
    ]
    paths += [f"/{name}/exchanges/{x}" for x in exchanges]
    paths += [f"{path}.json?_shape=objects" for path in paths]
    paths += [f"/{name}/-/task/{quote(t, safe='')}" for t in tasks]
    paths += [f"/{name}/events/{x},1" for x in exchanges] + ["/-/dashboards/streams", f"/{name}"]
    pages = {}
    for path in paths:
        response = await ds.client.get(path)
        assert response.status_code == 200, (path, response.text[:500])
        pages[path] = response.text
    return pages


# -- secrets ---------------------------------------------------------------------------------


async def test_record_keeps_secrets_out_of_the_log_its_cassettes_and_the_inspector(tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []
    db = tmp_path / "captures.db"
    found: list[str] = []
    async with (
        agent_with_password(seen) as upstream,
        tasktape("record", "--listen", "127.0.0.1:0", "--upstream", upstream, "--db", str(db), *REDACT) as (
            _,
            url,
            printed,
        ),
        aiohttp.ClientSession() as session,
    ):
        received = await send(url, session)
        await committed(db, 1)
        found += [
            leak for path in log_files(db) for leak in leaked(path.read_bytes(), f"{path.name} (recording)")
        ]
    # The client and the agent saw everything as it was sent; only the log is redacted.
    assert SECRETS["event JSON"].encode() in received
    assert (
        seen[0]["Authorization"] == HEADERS["Authorization"]
        and seen[0]["X-Team-Secret"] == HEADERS["X-Team-Secret"]
    )
    found += [leak for path in log_files(db) for leak in leaked(path.read_bytes(), f"{path.name} (stopped)")]
    found += leaked("".join(printed), "what tasktape record printed")
    cassette = tmp_path / "session.jsonl"
    export = CliRunner().invoke(main, ["export", str(db), "-o", str(cassette)])
    assert export.exit_code == 0, export.output
    text = cassette.read_text()
    (exported,) = read_cassette(cassette)
    assert ("Authorization", "[REDACTED]") in exported.request_headers
    assert exported.query == "lang=en&key=[REDACTED]&team_token=[REDACTED]"
    assert json.loads(exported.request_body or b"")["message"]["metadata"]["apiKey"] == "[REDACTED]"
    found += leaked(text, "the exported cassette")
    for path, page in (await inspector_pages(db)).items():
        found += leaked(page, f"the inspector's {path}")
    assert found == []


async def test_record_missing_keeps_secrets_out_of_the_log(tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []
    db = tmp_path / "missing.db"
    cassette = str(ROOT / "cassettes" / "completed.jsonl")
    args = [
        "replay",
        cassette,
        "--listen",
        "127.0.0.1:0",
        "--mode",
        "record-missing",
        "--db",
        str(db),
        *REDACT,
    ]
    async with (
        agent_with_password(seen) as upstream,
        tasktape(*args, "--upstream", upstream, "--speed", "0") as (_, url, printed),
        aiohttp.ClientSession() as session,
    ):
        first = await send(url, session)
        await committed(db, 1)
        found = [leak for path in log_files(db) for leak in leaked(path.read_bytes(), path.name)]
    assert found == [] and seen[0]["Cookie"] == HEADERS["Cookie"]
    assert [leak for path in log_files(db) for leak in leaked(path.read_bytes(), path.name)] == []
    assert leaked("".join(printed), "what tasktape replay printed") == []
    # Replayed from what was recorded, without the agent: redacted values match what is sent.
    with EventLog(db) as log:
        runner, url = await start_site(ReplayServer(from_log(log), speed=0).app, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            replayed = await send(url, session)
    finally:
        await runner.cleanup()
    assert replayed == first.replace(SECRETS["event JSON"].encode(), b"[REDACTED]") and len(seen) == 1


async def test_credentials_in_the_upstream_url_go_to_the_upstream_alone(record: RecordFactory) -> None:
    password = SECRETS["upstream password"]
    seen: list[tuple[str | None, str]] = []

    async def anything(request: web.Request) -> web.Response:
        seen.append((request.headers.get("Authorization"), request.host))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    upstream = TestServer(app, host="127.0.0.1")
    await upstream.start_server()
    at = f"127.0.0.1:{upstream.port}"
    try:
        rec = await record(f"http://agent:{password}@{at}")
        async with rec.session.get(f"{rec.url}/x") as r:
            assert r.status == 200
        async with rec.session.get(f"{rec.url}/x", headers={"Authorization": "Bearer mine"}) as r:
            assert r.status == 200  # the client's own credentials pass instead
    finally:
        await upstream.close()
    basic = "Basic " + base64.b64encode(f"agent:{password}".encode()).decode()
    assert seen == [(basic, at), ("Bearer mine", at)]
    # Once the upstream is gone, the client's 502 names it, without its credentials.
    dead = await record(f"http://agent:{password}@{at}")
    async with dead.session.get(f"{dead.url}/x") as r:
        assert r.status == 502 and leaked(await r.read(), "the 502") == []
    for recording in (rec, dead):
        with await recording.log() as log:
            assert log.exchanges() and log.captures()[0]["upstream"] == f"http://{at}"
        assert [
            leak for path in log_files(recording.db) for leak in leaked(path.read_bytes(), path.name)
        ] == []


@pytest.fixture
def threaded_agent() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """The secrets agent in a thread of its own (pytester runs pytest in this one)."""
    seen: list[dict[str, str]] = []
    with in_thread(secrets_agent(seen)) as url:
        yield url.replace("http://", f"http://agent:{SECRETS['upstream password']}@"), seen


INI = "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
PLUGIN_TEST = f"""
import httpx
import pytest

@pytest.mark.tasktape(
    redact_headers="X-Team-Secret",
    redact_query="team_token",
    redact_json=["/message/metadata/apiKey", "/statusUpdate/metadata/connectorToken"],
)
def test_ask(tasktape):
    url = tasktape.url + "/message:stream?{QUERY}"
    with httpx.stream("POST", url, json={REQUEST!r}, headers={HEADERS!r}) as r:
        assert r.status_code == 200 and "TASK_STATE_COMPLETED" in r.read().decode()
"""


def test_the_pytest_plugin_records_cassettes_without_secrets(
    pytester: pytest.Pytester, threaded_agent: tuple[str, list[dict[str, str]]]
) -> None:
    upstream, seen = threaded_agent
    pytester.makeini(INI)
    pytester.makepyfile(test_secret=PLUGIN_TEST)
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--tasktape-record-mode=once", f"--tasktape-upstream={upstream}"
    )
    result.assert_outcomes(passed=1)
    assert len(seen) == 1 and seen[0]["X-API-Key"] == HEADERS["X-API-Key"]
    cassette = pytester.path / "cassettes" / "test_secret" / "test_ask.jsonl"
    assert leaked(cassette.read_text(), cassette.name) == []
    assert leaked(str(result.stdout) + str(result.stderr), "pytest's output") == []
    # And the redacted cassette replays: redacted values match whatever is sent.
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert len(seen) == 1


# -- not an open proxy ---------------------------------------------------------------------------


def counting(name: str, hits: list[str], location: str | None = None) -> web.Application:
    """A server noting every request it gets in ``hits``; with ``location``, it redirects there."""

    async def anything(request: web.Request) -> web.Response:
        hits.append(f"{name} {request.method} {request.raw_path} Host: {request.host}")
        if location:
            raise web.HTTPFound(location)
        return web.Response(text=name)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    return app


async def raw_request(url: str, head: str) -> bytes:
    """Send ``head`` as it is (request line and headers) and read the whole answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head.encode() + b"\r\nConnection: close\r\n\r\n")
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def tricks(evil: str) -> list[tuple[str, bytes]]:
    """(request head, the status line's start) that try to reach ``evil`` (HOST:PORT)."""
    refused, forwarded = b"HTTP/1.1 400", b"HTTP/1.1 200"
    return [
        (f"GET http://{evil}/x HTTP/1.1\r\nHost: {evil}", refused),
        (f"GET HTTP://{evil.replace('127.0.0.1', 'localhost')}/x HTTP/1.1\r\nHost: {evil}", refused),
        (f"CONNECT {evil} HTTP/1.1\r\nHost: {evil}", b"HTTP/1.1 40"),
        ("OPTIONS * HTTP/1.1\r\nHost: x", b"HTTP/1.1 40"),
        (f"GET //{evil}/x HTTP/1.1\r\nHost: {evil}", forwarded),
        (f"GET /@{evil}/x HTTP/1.1\r\nHost: {evil}", forwarded),
        (f"GET /..%2F..%2F@{evil}/x HTTP/1.1\r\nHost: {evil}", forwarded),
        (f"GET /x HTTP/1.1\r\nHost: {evil}\r\nX-Forwarded-Host: {evil}\r\nForwarded: host={evil}", forwarded),
        (f"GET /x HTTP/1.1\r\nHost: user@{evil}", forwarded),
        (f"GET {evil}/x HTTP/1.1\r\nHost: {evil}", b"HTTP/1.0 400"),
        (f"GET \\\\{evil}/x HTTP/1.1\r\nHost: {evil}", b"HTTP/1.0 400"),
    ]


async def test_only_the_upstream_is_ever_contacted(record: RecordFactory) -> None:
    hits: list[str] = []
    evil = TestServer(counting("evil", hits), host="127.0.0.1")
    await evil.start_server()
    evil_at = f"127.0.0.1:{evil.port}"
    try:
        rec = await record(counting("upstream", hits))
        redirecting = await record(counting("upstream", hits, location=f"http://{evil_at}/x"))
        passthrough = ReplayServer([], mode=ReplayMode.PASSTHROUGH, upstream=rec.upstream)
        runner, replay_url = await start_site(passthrough.app, "127.0.0.1", 0)
        try:
            for url in (rec.url, replay_url):
                for head, status in tricks(evil_at):
                    answer = await raw_request(url, head)
                    assert answer.startswith(status), (url, head, answer[:300])
            # A redirect elsewhere is passed back, never followed.
            async with redirecting.session.get(f"{redirecting.url}/go", allow_redirects=False) as r:
                assert (r.status, r.headers["Location"]) == (302, f"http://{evil_at}/x")
        finally:
            await runner.cleanup()
    finally:
        await evil.close()
    assert [h for h in hits if not h.startswith("upstream ")] == []
    assert all(h.endswith(f"Host: {rec.upstream.removeprefix('http://')}") for h in hits if "/go" not in h)


# -- listening ------------------------------------------------------------------------------------


def listening_on(port: int) -> set[str]:
    """The IPv4 addresses ``port`` listens on, from the kernel's table of sockets."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the socket table of Linux")
async def test_everything_listens_on_loopback_unless_told_otherwise_and_then_warns(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with LogWriter(db):
        pass

    def command(name: str, host: str | None) -> list[str]:
        """The command on a free port: on ``host``, or where it listens by default."""
        if name == "inspect":
            return ["inspect", str(db), "--port", "0", *(["--host", host] if host else [])]
        listen = ["--listen", f"{host}:0" if host else "0"]
        return {
            "record": [
                "record",
                "--upstream",
                "http://127.0.0.1:9",
                "--db",
                str(tmp_path / f"{host}.db"),
                *listen,
            ],
            "replay": ["replay", str(ROOT / "cassettes" / "completed.jsonl"), *listen],
            "agent": ["agent", *listen],
        }[name]

    async def serve(name: str, host: str | None) -> tuple[str, set[str], str]:
        async with tasktape(*command(name, host)) as (_, url, printed):
            addresses = listening_on(int(url.rsplit(":", 1)[1]))
        return url, addresses, printed[-1]

    runs = [(name, host) for name in ("record", "replay", "agent", "inspect") for host in (None, "0.0.0.0")]
    results = await asyncio.gather(*(serve(name, host) for name, host in runs))
    for (name, host), (url, addresses, stderr) in zip(runs, results, strict=True):
        if host:
            assert addresses == {"0.0.0.0"} and url.startswith("http://0.0.0.0:"), (name, url)
            assert (
                f"WARNING: tasktape {name} is listening on 0.0.0.0, beyond this machine's loopback" in stderr
            )
            # What it says is given away is true of it: only the recorder records.
            assert ("what they send is recorded" in stderr) == (name == "record"), (name, stderr)
        else:
            assert addresses == {"127.0.0.1"} and url.startswith("http://127.0.0.1:"), (name, url)
            # (record may warn that its upstream, nothing on port 9, did not answer)
            assert "beyond this machine's loopback" not in stderr, (name, stderr)


# -- the inspector -------------------------------------------------------------------------------


def small_log(path: Path, frames: list[dict[str, Any]], ids: str = "e", header: str = "") -> Path:
    """A log of one stream of ``frames`` (with SSE ids ``ids<n>``, and ``header`` among its headers)."""
    with LogWriter(path) as w:
        ex = w.begin_exchange(w.begin_capture(source="test"), method="POST", path="/message:stream")
        headers = {"Content-Type": "text/event-stream", "X-Agent": header}
        w.response_head(ex, status=200, headers=headers, is_sse=True, ttfb_ns=1)
        for n, data in enumerate(sse(frames, ids=ids), 1):
            w.chunk(ex, n * 1_000_000, data)
        w.end_exchange(ex, duration_ns=len(frames) * 1_000_000)
    return path


async def test_the_inspector_cannot_write_to_the_log(tmp_path: Path) -> None:
    db = small_log(tmp_path / "ro.db", completed_run())
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    ds = create_datasette(db)
    attempts = [
        ("POST", "/ro/search_event_text", {"text": "asthma"}),
        ("POST", "/ro/tasks_by_final_state", {"state": "completed"}),
        ("POST", "/ro/-/insert", {"table": "findings"}),
        ("POST", "/ro/events/-/insert", {"rows": "[]"}),
        ("POST", "/ro/events/1,1/-/delete", {}),
        ("POST", "/ro/events/-/drop", {}),
        ("POST", "/-/create", {"table": "x"}),
        ("POST", "/ro", {"sql": "DELETE FROM events"}),
        ("GET", "/ro.json?sql=DELETE+FROM+events", None),
        ("GET", "/ro.json?sql=INSERT+INTO+findings(rule)+VALUES('x')", None),
        ("GET", "/ro.json?sql=WITH+x+AS+(SELECT+1)+DELETE+FROM+events", None),
        ("GET", "/ro.json?sql=SELECT+1;DELETE+FROM+events", None),
        ("GET", "/ro.json?sql=ATTACH+DATABASE+'/tmp/tt-attached.db'+AS+x", None),
        ("GET", "/ro.json?sql=PRAGMA+journal_mode=delete", None),
        ("GET", "/ro.json?sql=SELECT+load_extension('x')", None),
    ]
    for method, path, data in attempts:
        response = await (ds.client.post(path, data=data) if method == "POST" else ds.client.get(path))
        assert response.status_code >= 400, (method, path, response.text[:300])
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    with EventLog(db) as log:
        assert log.db.execute("SELECT count(*) FROM events").fetchone()[0] == len(completed_run())
        assert log.db.execute("SELECT count(*) FROM findings").fetchone()[0] == 0


async def test_what_an_agent_streams_cannot_script_the_inspector(tmp_path: Path) -> None:
    script, tag = "<script>alert('tasktape')</script>", '"><img src=x onerror=alert(1)>'
    task_id, ctx = f"task.{tag}", f"ctx.{tag}"
    working = status(task_id, ctx, "TASK_STATE_WORKING")
    working["statusUpdate"]["status"]["message"] = {"parts": [{"text": script}]}
    frames = [
        task(task_id, ctx, "TASK_STATE_SUBMITTED"),
        working,
        artifact(task_id, ctx, f"art.{tag}", script, kind=tag),
        artifact(task_id, ctx, f"art.{tag}", script, last_chunk=True, kind=tag),
        status(task_id, ctx, f"TASK_STATE_{tag}", usage={"model": script, "credits": tag}),
    ]
    db = small_log(tmp_path / "xss.db", frames, ids=tag, header=script)
    pages = {path: page for path, page in (await inspector_pages(db)).items() if ".json" not in path}
    task_page = next(page for path, page in pages.items() if "/-/task/" in path)
    assert "&lt;script&gt;alert(" in task_page and 'class="tt-timeline"' in task_page  # shown, as text
    for path, page in pages.items():
        assert "<script>alert(" not in page and "<img src=x" not in page, path


# -- cassette paths in the pytest plugin -----------------------------------------------------------


def test_a_cassette_path_cannot_leave_the_test_suites_folder(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makeini(INI)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "completed.jsonl").write_bytes((ROOT / "cassettes" / "completed.jsonl").read_bytes())
    (pytester.path / "cassettes").mkdir()
    (pytester.path / "cassettes" / "completed.jsonl").write_bytes((outside / "completed.jsonl").read_bytes())
    (pytester.path / "cassettes" / "linked.jsonl").symlink_to(outside / "completed.jsonl")
    (pytester.path / "shared").symlink_to(outside, target_is_directory=True)
    (pytester.path / "sub").mkdir()
    (pytester.path / "cassettes" / "broken.jsonl").write_text('{"tasktape_cassette": 1}\n{"chunk": 1}\n')
    escape = f"../{'../' * len(pytester.path.parts)}{outside.relative_to('/')}/new.jsonl"
    pytester.makepyfile(
        test_paths=f"""
        import httpx
        import pytest

        @pytest.mark.tasktape({escape!r})
        def test_dot_dot(tasktape):
            pass

        @pytest.mark.tasktape({str(outside / "completed.jsonl")!r})
        def test_absolute(tasktape):
            pass

        @pytest.mark.tasktape("cassettes/linked.jsonl")
        def test_a_symlinked_file(tasktape):
            pass

        @pytest.mark.tasktape("shared/completed.jsonl")
        def test_a_symlinked_folder(tasktape):
            pass

        @pytest.mark.tasktape("sub/../cassettes/completed.jsonl")
        def test_a_step_up_that_stays_inside(tasktape):
            assert httpx.get(tasktape.url + "/.well-known/agent-card.json").status_code == 200

        @pytest.mark.tasktape("cassettes/broken.jsonl")
        def test_broken(tasktape):
            pass
        """
    )
    # Recording, each would be written over: none is even read.
    result = pytester.runpytest_inprocess(
        "-p",
        "no:cacheprovider",
        "-k",
        "dot_dot or absolute or symlinked",
        "--tasktape-record-mode=all",
        "--tasktape-upstream=http://127.0.0.1:9",
    )
    result.assert_outcomes(errors=4)
    outside_tree = f"is outside the test's directory tree ({pytester.path}); keep cassettes under it"
    result.stdout.fnmatch_lines_random(
        [
            f"*@pytest.mark.tasktape: the cassette *{name} {outside_tree}*"
            for name in (
                "new.jsonl",
                "outside/completed.jsonl",
                "cassettes/linked.jsonl",
                "shared/completed.jsonl",
            )
        ]
    )
    assert sorted(p.name for p in outside.iterdir()) == ["completed.jsonl"]  # nothing written there
    replayed = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-k", "stays_inside or broken")
    replayed.assert_outcomes(passed=1, errors=1)
    replayed.stdout.fnmatch_lines(["*tasktape: */cassettes/broken.jsonl:2: chunk: *"])
    assert "Traceback" not in str(replayed.stdout) and "CassetteError" not in str(replayed.stdout)
