"""Agent cards served through the proxy point at the proxy; secrets never reach the log."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from a2a_frames import completed_run, sse
from aiohttp import web
from conftest import RecordFactory

from tasktape.eventlog.redact import Redactor

SECRET = "sk-proxy-secret-31415926"


def card_app(base: list[str]) -> web.Application:
    """An agent whose card lists URLs on its own address (filled in once it listens)."""

    def card() -> dict:
        return {
            "name": "demo",
            "supportedInterfaces": [
                {"url": f"{base[0]}/", "protocolBinding": "HTTP+JSON"},
                {"url": f"{base[0].replace('127.0.0.1', 'localhost')}/jsonrpc", "protocolBinding": "JSONRPC"},
                {"url": "https://elsewhere.example/a2a", "protocolBinding": "GRPC"},
            ],
            "provider": {"url": "https://vendor.example"},
        }

    async def well_known(request: web.Request) -> web.Response:
        return web.json_response(card())

    async def extended(request: web.Request) -> web.Response:
        return web.json_response({**card(), "name": "extended"})

    async def rpc(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": {**card(), "name": "rpc"}})

    app = web.Application()
    app.router.add_get("/.well-known/agent-card.json", well_known)
    app.router.add_get("/extendedAgentCard", extended)
    app.router.add_post("/jsonrpc", rpc)
    return app


async def test_cards_are_rewritten_to_point_at_the_proxy(record: RecordFactory) -> None:
    base: list[str] = []
    app = card_app(base)
    rec = await record(app)
    base.append(rec.upstream)
    urls = []
    async with rec.session.get(f"{rec.url}/.well-known/agent-card.json") as r:
        urls.append([i["url"] for i in (await r.json())["supportedInterfaces"]])
    async with rec.session.get(f"{rec.url}/extendedAgentCard") as r:
        urls.append([i["url"] for i in (await r.json())["supportedInterfaces"]])
    rpc = {"jsonrpc": "2.0", "id": 7, "method": "GetExtendedAgentCard", "params": {}}
    async with rec.session.post(f"{rec.url}/jsonrpc", json=rpc) as r:
        body = await r.json()
        urls.append([i["url"] for i in body["result"]["supportedInterfaces"]])
        assert body["id"] == 7 and body["result"]["provider"] == {"url": "https://vendor.example"}
    expected = [f"{rec.url}/", f"{rec.url}/jsonrpc", "https://elsewhere.example/a2a"]
    assert urls == [expected] * 3
    with await rec.log() as log:
        (first, *_) = log.exchanges()
        # The log keeps the card exactly as the agent served it.
        recorded = json.loads(first["response_body"])
        assert recorded["supportedInterfaces"][0]["url"] == f"{rec.upstream}/"


async def test_public_url_and_no_rewrite(record: RecordFactory) -> None:
    base: list[str] = []
    rec = await record(card_app(base), public_url="https://gateway.example/agent")
    base.append(rec.upstream)
    async with rec.session.get(f"{rec.url}/.well-known/agent-card.json") as r:
        urls = [i["url"] for i in (await r.json())["supportedInterfaces"]]
    assert urls[:2] == ["https://gateway.example/agent/", "https://gateway.example/agent/jsonrpc"]
    base.clear()
    rec = await record(card_app(base), rewrite_cards=False)
    base.append(rec.upstream)
    async with rec.session.get(f"{rec.url}/.well-known/agent-card.json") as r:
        assert (await r.json())["supportedInterfaces"][0]["url"] == f"{rec.upstream}/"


async def test_secrets_appear_nowhere_in_the_log_files(record: RecordFactory) -> None:
    frames = completed_run()
    frames[1]["statusUpdate"]["metadata"] = {"connectorToken": SECRET}

    async def stream(request: web.Request) -> web.StreamResponse:
        assert request.headers["Authorization"] == f"Bearer {SECRET}"  # the agent still gets it
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Set-Cookie": f"session={SECRET}"}
        )
        await response.prepare(request)
        for frame in sse(frames, ids="e"):
            await response.write(frame)
        return response

    app = web.Application()
    app.router.add_post("/message:stream", stream)
    redactor = Redactor(
        headers=["X-Tenant-Secret"],
        json_pointers=["/message/metadata/apiKey", "/statusUpdate/metadata/connectorToken"],
    )
    rec = await record(app, redactor=redactor)
    headers = {
        "Authorization": f"Bearer {SECRET}",
        "Cookie": f"s={SECRET}",
        "X-Api-Key": SECRET,
        "X-Tenant-Secret": SECRET,
    }
    request = {"message": {"metadata": {"apiKey": SECRET}, "parts": [{"text": "hi"}]}}
    async with rec.session.post(f"{rec.url}/message:stream", json=request, headers=headers) as r:
        received = await r.read()
    assert SECRET.encode() in received  # the client sees the stream unchanged
    with await rec.log() as log:
        assert len(log.events(1)) == 10
    files = [p for p in Path(rec.db).parent.iterdir() if p.name.startswith(rec.db.name)]
    assert {p.name for p in files} >= {rec.db.name, f"{rec.db.name}-wal"}
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path.name


async def test_a_client_asking_for_gzip_still_gets_a_rewritten_card(record: RecordFactory) -> None:
    base: list[str] = []
    seen: list[str | None] = []

    async def card(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Accept-Encoding"))
        response = web.json_response(
            {"supportedInterfaces": [{"url": base[0], "protocolBinding": "JSONRPC"}]}
        )
        if request.headers.get("Accept-Encoding"):
            response.enable_compression()
        return response

    async def send(request: web.Request) -> web.Response:
        # An answer that mentions GetExtendedAgentCard and carries a url: not a card.
        return web.json_response(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "result": {
                    "message": {
                        "parts": [{"url": f"{base[0]}/files/report.pdf", "text": "GetExtendedAgentCard"}]
                    }
                },
            }
        )

    app = web.Application()
    app.router.add_get("/.well-known/agent-card.json", card)
    app.router.add_post("/", send)
    rec = await record(app)
    base.append(rec.upstream)
    async with aiohttp.ClientSession() as client:  # decompresses, as httpx does
        async with client.get(
            f"{rec.url}/.well-known/agent-card.json", headers={"Accept-Encoding": "gzip"}
        ) as r:
            assert (await r.json())["supportedInterfaces"][0]["url"] == rec.url
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"text": "GetExtendedAgentCard"}}
        async with client.post(f"{rec.url}/", json=rpc) as r:
            assert (await r.json())["result"]["message"]["parts"][0][
                "url"
            ] == f"{rec.upstream}/files/report.pdf"
    assert seen == [None]  # the proxy asked for the card uncompressed


async def test_a_client_leaving_while_the_card_loads_ends_the_exchange(record: RecordFactory) -> None:
    async def slow_card(request: web.Request) -> web.Response:
        await asyncio.sleep(1)
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/.well-known/agent-card.json", slow_card)
    rec = await record(app)
    with pytest.raises(asyncio.TimeoutError):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.2)) as client:
            await client.get(f"{rec.url}/.well-known/agent-card.json")
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert x["outcome"] == "client_disconnected"
