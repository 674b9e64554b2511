"""The replay server's control API: arming, listing, the report, reset; what it refuses
(other methods and paths, bodies that are not JSON, other hosts and origins), and that its
paths are never matched against recordings nor forwarded."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import aiohttp
from conftest import Serve
from test_replay_faults import card_and_stream, wire

from tasktape.agent import create_agent_app
from tasktape.eventlog import EventLog, LogWriter
from tasktape.replay import ReplayMode, ReplayServer, load
from tasktape.replay.control import _loopback
from tasktape.replay.kept import KEPT


async def test_the_control_api_arms_reports_and_resets(serve: Serve, tmp_path: Path) -> None:
    cassette = card_and_stream(tmp_path)
    server = ReplayServer(load([cassette]), speed=0, allow_repeats=True)
    url = await serve(server.app)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/_tasktape/faults", json={"fault": "drop-after=1;times=1"}) as r:
            armed = (await r.json())["armed"]
        assert armed == {
            "fault": "drop-after=1;times=1",
            "source": "POST /_tasktape/faults",
            "seen": 0,
            "applied": 0,
        }
        assert len((await wire(url, "/events")).events) == 1
        assert len((await wire(url, "/events")).events) == 5
        async with session.get(f"{url}/_tasktape/faults") as r:
            assert [(a["seen"], a["applied"]) for a in (await r.json())["armed"]] == [(2, 1)]
        async with session.get(f"{url}/_tasktape/report") as r:
            streams = (await r.json())["streams"]
        assert [s["identical"] for s in streams] == [False, True]
        assert streams[0]["faults"] == ["drop-after=1"] and streams[0]["reasons"] == ["fault: drop-after=1"]
        async with session.post(f"{url}/_tasktape/reset", json={}) as r:
            assert (await r.json())["armed"] == []
        # Refused: a body that is not JSON, a spec that does not parse, a spec with no fault.
        async with session.post(f"{url}/_tasktape/faults", data="drop-after=1") as r:
            assert r.status == 415
        for bad in ({"fault": "explode=1"}, {"fault": "times=1"}, {"spec": "drop-after=1"}):
            async with session.post(f"{url}/_tasktape/faults", json=bad) as r:
                assert r.status == 400, bad
    assert _loopback("127.0.0.1") and _loopback("::1") and not _loopback("192.0.2.7") and not _loopback(None)


async def test_every_path_under_it_is_its_own(serve: Serve, tmp_path: Path) -> None:
    server = ReplayServer(load([card_and_stream(tmp_path)]), speed=0)
    url = await serve(server.app)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/_tasktape/other") as r:
            assert r.status == 404 and "no part of the control API" in (await r.json())["error"]["message"]
        # The prefix itself too, without its slash: it was looked for among the recordings.
        async with session.get(f"{url}/_tasktape") as r:
            assert r.status == 404
            assert (await r.json())["error"]["message"] == (
                "/_tasktape is no part of the control API: see faults, report, reset"
            )
        async with session.put(f"{url}/_tasktape/faults", json={}) as r:
            assert r.status == 405 and (await r.json())["error"]["allowed"] == ["GET", "POST"]
        async with session.options(f"{url}/_tasktape/faults") as r:
            assert r.status == 405 and "Access-Control-Allow-Origin" not in r.headers
    assert server.stats.missed == []
    # Nor are they forwarded where everything else is.
    agent = await serve(create_agent_app(pace=0))
    passthrough = await serve(ReplayServer([], mode=ReplayMode.PASSTHROUGH, upstream=agent).app)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{passthrough}/_tasktape/report") as r:
            assert r.status == 200 and (await r.json())["streams"] == []
        async with session.get(f"{passthrough}/_tasktape") as r:
            assert r.status == 404 and "no part of the control API" in (await r.json())["error"]["message"]
        # Nor can a fault be armed there: nothing is replayed to make it on.
        async with session.post(f"{passthrough}/_tasktape/faults", json={"fault": "drop-after=1"}) as r:
            assert (
                r.status == 400 and "mode passthrough replays nothing" in (await r.json())["error"]["message"]
            )
        async with session.get(f"{passthrough}/_tasktape/faults") as r:
            assert await r.json() == {"armed": [], "not_applied": [], "not_applied_total": 0}


async def test_other_hosts_origins_and_bodies_are_refused(serve: Serve, tmp_path: Path) -> None:
    url = await serve(ReplayServer(load([card_and_stream(tmp_path)]), speed=0).app)
    spec = {"fault": "drop-after=1"}
    async with aiohttp.ClientSession() as session:
        # A name a page re-pointed at loopback (DNS rebinding), and a page of another origin.
        async with session.post(
            f"{url}/_tasktape/faults", json=spec, headers={"Host": "rebind.example"}
        ) as r:
            assert r.status == 403
        async with session.post(
            f"{url}/_tasktape/faults", json=spec, headers={"Origin": "http://evil.example"}
        ) as r:
            assert r.status == 403 and "its own origin" in await r.text()
        for malformed in ("http://[", "http://127.0.0.1:99999"):  # no URL: refused as foreign
            async with session.get(f"{url}/_tasktape/faults", headers={"Origin": malformed}) as r:
                assert r.status == 403 and "its own origin" in await r.text()
        async with session.post(f"{url}/_tasktape/faults", json=spec, headers={"Origin": url}) as r:
            assert r.status == 200
        deep = "[" * 50_000
        async with session.post(
            f"{url}/_tasktape/faults", data=deep, headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 400
        async with session.post(
            f"{url}/_tasktape/faults", data="x" * 100_000, headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 413
    got = await wire(url, "/_tasktape/faults")
    assert got.status == 200
    assert _loopback("::ffff:127.0.0.1") and not _loopback("::ffff:192.0.2.7")


async def test_a_spec_that_decodes_past_its_bound_is_refused_naming_the_bound(
    serve: Serve, tmp_path: Path
) -> None:
    """A gzipped body that decodes to more than a fault spec may be is refused as one sent
    that big: with the control API's own bound, not an option replay does not have."""
    url = await serve(ReplayServer(load([card_and_stream(tmp_path)]), speed=0).app)
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    spec = b'{"fault": "drop-after=1"}'
    async with aiohttp.ClientSession() as session:
        padded = gzip.compress(b" " * 100_000 + spec)
        async with session.post(f"{url}/_tasktape/faults", data=padded, headers=headers) as r:
            assert r.status == 413
            assert (await r.json())["error"]["message"] == (
                "a fault spec is at most 65536 bytes, decoded from its Content-Encoding gzip"
            )
        async with session.post(f"{url}/_tasktape/faults", data=gzip.compress(spec), headers=headers) as r:
            assert r.status == 200 and (await r.json())["armed"]["fault"] == "drop-after=1"


async def test_a_path_naming_it_encoded_is_its_own_too(serve: Serve, tmp_path: Path) -> None:
    """``/_tasktape%2Freport`` is ``/_tasktape/report`` as the replay reads paths: the
    control API answers it, in every mode; it is neither matched nor forwarded nor recorded."""
    server = ReplayServer(load([card_and_stream(tmp_path)]), speed=0)
    url = await serve(server.app)
    report = await wire(url, "/_tasktape%2Freport")
    assert report.status == 200 and json.loads(report.body)["streams"] == []
    other = await wire(url, "/%5Ftasktape%2Fother")
    assert other.status == 404 and "/_tasktape/other is no part of the control API" in other.body.decode()
    assert (await wire(url, "/_tasktape%2Freset")).status == 405
    assert server.stats.missed == [] and server.stats.refused == []
    agent = await serve(create_agent_app(pace=0))
    db = tmp_path / "grows.db"
    with LogWriter(db) as writer:
        missing = ReplayServer(
            [], speed=0, mode=ReplayMode.RECORD_MISSING, upstream=agent, writer=writer, log_path=db
        )
        url = await serve(missing.app)
        armed = await wire(url, "/_tasktape%2Ffaults", {"fault": "drop-after=1"})
        assert armed.status == 200 and json.loads(armed.body)["armed"]["fault"] == "drop-after=1"
        assert missing.stats.forwarded == 0 and [str(a.faults) for a in missing.armed] == ["drop-after=1"]
    with EventLog(db) as log:
        assert log.exchanges() == []


async def test_faults_not_made_are_listed_once_each_with_counts(serve: Serve) -> None:
    """On a long run the control API lists the first of each distinct fault not made with how
    many times it came, and how many there were in all, past those it lists."""
    agent = await serve(create_agent_app(pace=0))
    passthrough = ReplayServer([], mode=ReplayMode.PASSTHROUGH, upstream=agent)
    url = await serve(passthrough.app)
    fault = {"X-Tasktape-Fault": "status=503"}
    async with aiohttp.ClientSession() as session:
        for n in [0, 0, 0, *range(1, KEPT + 5)]:
            async with session.get(f"{url}/tasks/t{n}", headers=fault) as r:
                await r.read()
        async with session.get(f"{url}/_tasktape/faults") as r:
            listed = await r.json()
    assert listed["not_applied_total"] == KEPT + 7
    assert [(u["request"], u["times"]) for u in listed["not_applied"][:2]] == [
        ("GET /tasks/t0", 3),
        ("GET /tasks/t1", 1),
    ]
    assert len(listed["not_applied"]) == KEPT and listed["not_applied"][0]["fault"] == "status=503"
