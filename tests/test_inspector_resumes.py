"""Reconnects on the task page: the rows a resuming recorder wrote into ``resumes``, each a
mark on the task's time axis (where the row's at_ns falls), labelled and classed by how it
went, and listed in a Reconnects table. A real log written by LogWriter, Datasette in
process over it."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from a2a_frames import artifact, completed_run, sse, status, task
from datasette.app import Datasette
from inspector_log import page

from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.resumes import Resume, ResumeOutcome, ResumeSide
from tasktape.inspector.app import create_datasette
from tasktape.inspector.task_page import Reconnect, load_task
from tasktape.inspector.timeline import RECONNECT_COLOURS, reconnect_label

DB = "rc"
MS = 1_000_000
SSE = {"content-type": "text/event-stream"}
LOST_ERROR = "no subscribe succeeded within 30 s: the agent answered 404 Not Found"


def _stream(w: LogWriter, cap: int, path: str, started_ns: int, chunks: list[bytes], **end: str) -> int:
    """A POST stream whose chunks came 50 ms apart (from ``started_ns``), ended after the last."""
    x = w.begin_exchange(cap, method="POST", path=path, started_ns=started_ns)
    w.response_head(x, status=200, headers=SSE, is_sse=True, ttfb_ns=10 * MS)
    for n, data in enumerate(chunks, 1):
        w.chunk(x, n * 50 * MS, data)
    w.end_exchange(x, duration_ns=(len(chunks) + 1) * 50 * MS, **end)
    return x


def _since(started_ns: int, later_ms: int) -> int:
    """An offset from ``started_ns`` ``later_ms`` after now: events that come after a reconnect."""
    return time.time_ns() - started_ns + later_ms * MS


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """task.rc: its stream broke after r4; the client came back after r2 (exchange b), the
    recorder rejoined the agent (exchange c). task.lost: a forwarded reconnect brought a
    request of it (the held stream, e, is no task's), then its stream could not be rejoined.
    task.other: a client's unknown Last-Event-ID refused. task.plain: no reconnect."""
    path = tmp_path_factory.mktemp("resumes") / f"{DB}.db"
    ids: dict[str, int] = {}
    ctx = "ctx.rc"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        now = time.time_ns()
        ids["a"] = _stream(
            w,
            cap,
            "/message:stream",
            now - 300 * MS,
            sse(
                [
                    task("task.rc", ctx, "TASK_STATE_SUBMITTED"),
                    status("task.rc", ctx, "TASK_STATE_WORKING"),
                    artifact("task.rc", ctx, "art.rc", "Hel"),
                    artifact("task.rc", ctx, "art.rc", "lo", append=True),
                ],
                ids="r",
            ),
            outcome="upstream_disconnected",
        )
        # The client reconnects with Last-Event-ID r2 and is sent r3 and r4 from the log.
        b_start = time.time_ns()
        ids["b"] = b = w.begin_exchange(
            cap,
            method="GET",
            path="/tasks/task.rc:subscribe",
            started_ns=b_start,
            request_headers={"last-event-id": "r2"},
        )
        w.response_head(b, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
        w.resume(
            Resume(
                ids["a"],
                ResumeSide.CLIENT,
                ResumeOutcome.RESUMED,
                last_event_id="r2",
                events_from_log=2,
                new_exchange_id=b,
            )
        )
        replayed = sse(
            [artifact("task.rc", ctx, "art.rc", t, append=n > 0) for n, t in enumerate("xy")],
            ids="r",
            start=3,
        )
        for data in replayed:
            w.chunk(b, time.time_ns() - b_start, data)
        time.sleep(0.15)  # the two marks apart on the axis
        # The recorder subscribes to the agent again, and the stream goes on on it.
        c_start = time.time_ns()
        ids["c"] = c = w.begin_exchange(
            cap, method="GET", path="/tasks/task.rc:subscribe", started_ns=c_start
        )
        w.response_head(c, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
        w.resume(
            Resume(
                ids["a"],
                ResumeSide.UPSTREAM,
                ResumeOutcome.REJOINED,
                last_event_id="r4",
                events_from_log=4,
                new_exchange_id=c,
                attempts=2,
                synthesized=("r5",),
            )
        )
        tail = sse(
            [
                artifact("task.rc", ctx, "art.rc", "Hello", last_chunk=True),
                status("task.rc", ctx, "TASK_STATE_COMPLETED"),
            ],
            ids="r",
            start=5,
        )
        for n, data in enumerate(tail):
            w.chunk(c, _since(c_start, 100 + 50 * n), data)
        w.end_exchange(c, duration_ns=_since(c_start, 250))
        w.end_exchange(b, duration_ns=_since(b_start, 250))

        # task.lost
        now = time.time_ns()
        ids["e"] = _stream(w, cap, "/message:stream", now - 200 * MS, [], outcome="client_disconnected")
        ids["g"] = _stream(
            w,
            cap,
            "/message:stream",
            now - 150 * MS,
            sse(
                [task("task.lost", "ctx.lost"), status("task.lost", "ctx.lost", "TASK_STATE_WORKING")],
                ids="g",
            ),
            outcome="upstream_disconnected",
        )
        ids["f"] = f = _stream(
            w, cap, "/message:stream", now, sse([status("task.lost", "ctx.lost", "TASK_STATE_WORKING")])
        )
        w.resume(
            Resume(
                ids["e"], ResumeSide.CLIENT, ResumeOutcome.FORWARDED, last_event_id="x9", new_exchange_id=f
            )
        )
        time.sleep(0.15)
        w.resume(Resume(ids["g"], ResumeSide.UPSTREAM, ResumeOutcome.GAVE_UP, attempts=3, error=LOST_ERROR))
        # Nothing to subscribe to: the held stream e had no task yet. No task's page shows it.
        w.resume(Resume(ids["e"], ResumeSide.UPSTREAM, ResumeOutcome.NOT_RESUMABLE, error="no task yet"))

        # task.other, whose refused reconnect is a 400 to a request that names no task
        ids["o"] = o = _stream(
            w, cap, "/message:stream", time.time_ns(), sse(completed_run("task.other"), ids="o")
        )
        ids["d"] = d = w.begin_exchange(
            cap, method="POST", path="/message:stream", request_headers={"last-event-id": "zz9"}
        )
        w.response_head(d, status=400, headers={}, is_sse=False, ttfb_ns=MS)
        w.end_exchange(d, duration_ns=2 * MS)
        w.resume(
            Resume(
                o,
                ResumeSide.CLIENT,
                ResumeOutcome.REFUSED,
                last_event_id="zz9",
                new_exchange_id=d,
                error="no event zz9 in the stream held",
            )
        )

        ids["p"] = _stream(
            w, cap, "/message:stream", time.time_ns(), sse(completed_run("task.plain"), ids="p")
        )
    return path, ids


@pytest.fixture
def ds(log: tuple[Path, dict[str, int]]) -> Datasette:
    return create_datasette(log[0])


def _svg(html: str) -> str:
    (svg,) = re.findall(r'<svg class="tt-timeline".*?</svg>', html, re.S)
    return svg


def _attrs(element: str) -> dict[str, str]:
    return dict(re.findall(r'([\w-]+)="([^"]*)"', element))


def _marks(svg: str) -> list[tuple[str, dict[str, str], str]]:
    """The reconnect marks in drawing order: the element, its attributes, its title."""
    found = re.findall(r'<(circle|path) ([^>]*class="tt-reconnect [^"]*")><title>(.*?)</title>', svg)
    return [(tag, _attrs(attrs), title) for tag, attrs, title in found]


def _mark_x(tag: str, attrs: dict[str, str]) -> float:
    return float(attrs["cx"]) if tag == "circle" else float(attrs["d"].split()[0].removeprefix("M"))


def _axis(svg: str) -> tuple[float, float]:
    """x of 0 ms and pixels per ms, read off the axis's first and last tick labels."""
    ticks = [
        (float(x), float(n.replace(",", "")) * (1000 if unit == "s" else 1))
        for x, n, unit in re.findall(
            r'<text x="([\d.]+)" y="[\d.]+" class="tt-axis"[^>]*>([\d.,]+) (m?s)<', svg
        )
    ]
    (x0, ms0), (x1, ms1) = ticks[0], ticks[-1]
    assert ms0 == 0
    return x0, (x1 - x0) / ms1


def _labels(svg: str) -> dict[str, str]:
    """The mark labels drawn, and their colour."""
    return {
        text: fill for fill, text in re.findall(r'fill="(#\w+)" class="tt-mark-label"[^>]*>([^<]*)<', svg)
    }


def _resumes(path: Path) -> list[dict]:
    with EventLog(path) as opened:
        return list(opened.db.query("SELECT * FROM resumes ORDER BY id"))


def _origin(path: Path, exchange_id: int) -> int:
    with EventLog(path) as opened:
        return opened.exchange(exchange_id)["started_ns"]


async def test_each_reconnect_is_a_mark_where_it_happened_labelled_by_how_it_went(
    ds: Datasette, log: tuple[Path, dict[str, int]]
) -> None:
    path, ids = log
    html = await page(ds, f"/{DB}/-/task/task.rc")
    svg = _svg(html)
    marks = _marks(svg)
    # The client's reconnect a ring, the rejoin of the agent's stream a diamond, in time order.
    assert [(tag, a["class"]) for tag, a, _ in marks] == [
        ("circle", "tt-reconnect tt-side-client tt-rc-resumed"),
        ("path", "tt-reconnect tt-side-upstream tt-rc-rejoined"),
    ]
    assert marks[0][1]["stroke"] == RECONNECT_COLOURS[ResumeOutcome.RESUMED]
    assert marks[1][1]["fill"] == RECONNECT_COLOURS[ResumeOutcome.REJOINED]
    # Each at its row's at_ns on the task's axis (0: stream a's request).
    x0, per_ms = _axis(svg)
    origin = _origin(path, ids["a"])
    rows = [r for r in _resumes(path) if r["exchange_id"] == ids["a"]]
    xs = [_mark_x(tag, a) for tag, a, _ in marks]
    for x, row in zip(xs, rows, strict=True):
        assert x == pytest.approx(x0 + (row["at_ns"] - origin) / MS * per_ms, abs=0.3)
    assert xs[1] - xs[0] >= 150 * per_ms - 0.2  # recorded 150 ms apart
    # ...after the broken stream's last event, before the events the rejoined stream brought.
    last_on_a = max(float(x) for x in re.findall(rf'<rect x="([\d.]+)"[^>]*><title>#{ids["a"]}\.\d+ at', svg))
    first_on_c = min(
        float(x) for x in re.findall(rf'<rect x="([\d.]+)"[^>]*><title>#{ids["c"]}\.\d+ at', svg)
    )
    assert last_on_a < xs[0] < xs[1] < first_on_c
    # Labelled briefly, in the outcome's colour; the tooltip says the rest.
    labels = _labels(svg)
    assert labels["client reconnected after r2: 2 from log"] == RECONNECT_COLOURS[ResumeOutcome.RESUMED]
    assert labels["upstream rejoined (2 attempts)"] == RECONNECT_COLOURS[ResumeOutcome.REJOINED]
    assert marks[0][2].startswith(f"#{ids['a']}: client resumed at ")
    assert marks[0][2].endswith(f", after r2, 2 events from the log, on #{ids['b']}")
    assert marks[1][2].endswith(f", after r4, 4 events from the log, on #{ids['c']}, 2 attempts, made up r5")
    assert ">reconnects<" in svg and ">1 client, 1 upstream<" in svg
    assert "a client reconnected</span>" in html and "the agent's stream rejoined</span>" in html


async def test_the_reconnects_table_lists_them_with_links_to_the_new_exchanges(
    ds: Datasette, log: tuple[Path, dict[str, int]]
) -> None:
    path, ids = log
    html = await page(ds, f"/{DB}/-/task/task.rc")
    # Listed between the time axis and the state changes.
    assert html.index('id="timeline"') < html.index('id="reconnects"') < html.index('id="state-changes"')
    table = html.split('<section class="tt-section" id="reconnects">')[1].split("</section>")[0]
    assert "<h2>Reconnects</h2>" in table
    trs = re.findall(r'<tr class="([^"]*)">(.*?)</tr>', table, re.S)
    assert [cls for cls, _ in trs] == ["tt-side-client tt-rc-resumed", "tt-side-upstream tt-rc-rejoined"]
    cells = [
        [re.sub(r"<[^>]+>", "", td).strip() for td in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
        for _, tr in trs
    ]
    a, b, c = ids["a"], ids["b"], ids["c"]
    assert [row[1:] for row in cells] == [
        ["client", f"#{a}", "r2", "2", "resumed", f"#{b}", ""],
        ["upstream", f"#{a}", "r4", "4", "rejoined · 2 attempts · 1 made up", f"#{c}", ""],
    ]
    # The time, in ms on the task's axis, with the UTC time as its tooltip.
    rows = [r for r in _resumes(path) if r["exchange_id"] == a]
    origin = _origin(path, a)
    for row, shown in zip(rows, cells, strict=True):
        assert shown[0] == f"{(row['at_ns'] - origin) / MS:,.1f} ms"
        assert f'title="{row["at"]}"' in table
    assert f'<a href="/{DB}/exchanges/{b}">#{b}</a>' in table
    assert f'<a href="/{DB}/exchanges/{c}">#{c}</a>' in table


async def test_a_reconnect_is_the_tasks_by_its_new_exchange_and_a_long_error_is_cut_on_the_axis(
    ds: Datasette, log: tuple[Path, dict[str, int]]
) -> None:
    _, ids = log
    html = await page(ds, f"/{DB}/-/task/task.lost")
    marks = _marks(_svg(html))
    # The forwarded reconnect came on a stream of no task: its new exchange is task.lost's.
    assert [a["class"] for _, a, _ in marks] == [
        "tt-reconnect tt-side-client tt-rc-forwarded",
        "tt-reconnect tt-side-upstream tt-rc-gave-up",
    ]
    labels = _labels(_svg(html))
    assert labels["forwarded a client&#39;s x9 to the agent"] == RECONNECT_COLOURS[ResumeOutcome.FORWARDED]
    cut = "gave up: " + LOST_ERROR[: 48 - len("gave up: ") - 1] + "…"
    assert labels[cut] == RECONNECT_COLOURS[ResumeOutcome.GAVE_UP]
    assert marks[1][2].endswith(f", 3 attempts, {LOST_ERROR}")  # the whole error in the tooltip...
    table = html.split('id="reconnects"')[1].split("</section>")[0]
    assert f'<td class="tt-warn">{LOST_ERROR}</td>' in table  # ...and in the table
    assert f'<a href="/{DB}/exchanges/{ids["f"]}">#{ids["f"]}</a>' in table
    assert f'<a href="/{DB}/exchanges/{ids["e"]}">#{ids["e"]}</a>' in table  # the stream it came back to
    # The held stream's own row (no task yet, nothing to rejoin) is no task's.
    assert "not resumable" not in html and "no task yet" not in html


async def test_each_task_shows_its_own_reconnects_and_one_without_shows_none(
    ds: Datasette, log: tuple[Path, dict[str, int]]
) -> None:
    _, ids = log
    other = await page(ds, f"/{DB}/-/task/task.other")
    assert [a["class"] for _, a, _ in _marks(_svg(other))] == ["tt-reconnect tt-side-client tt-rc-refused"]
    assert "refused a client&#39;s zz9" in _labels(_svg(other))
    # The refused request named no task (it is not among the task's exchanges), yet it is linked.
    reconnects, exchanges = other.split('id="reconnects"')[1].split('id="exchanges"')
    assert f'<a href="/{DB}/exchanges/{ids["d"]}">#{ids["d"]}</a>' in reconnects
    assert f'href="/{DB}/exchanges/{ids["d"]}"' not in exchanges
    assert "no event zz9 in the stream held" in other
    assert "task.rc" not in other
    plain = await page(ds, f"/{DB}/-/task/task.plain")
    assert "Reconnects" not in plain and 'id="reconnects"' not in plain
    assert "tt-reconnect" not in plain and ">reconnects<" not in plain
    assert "a client reconnected" not in plain  # nor in the legend
    assert plain.count('class="tt-lane-title"') == 1  # its stream only


async def test_the_resumes_table_is_served_described_with_its_facets(ds: Datasette) -> None:
    html = await page(ds, f"/{DB}/resumes")
    assert "Reconnects" in html and "tasktape record --resume" in html
    facets = (await ds.client.get(f"/{DB}/resumes.json")).json()["facet_results"]
    assert {v["value"]: v["count"] for v in facets["outcome"]["results"]} == {
        "resumed": 1,
        "rejoined": 1,
        "forwarded": 1,
        "gave_up": 1,
        "not_resumable": 1,
        "refused": 1,
    }
    assert '<pre class="tt-json">[\n  &#34;r5&#34;\n]</pre>' in html  # synthesized, indented


def test_a_reconnects_slice_is_not_counted_or_drawn_again(log: tuple[Path, dict[str, int]]) -> None:
    """Exchange b holds two events the held stream (a) holds too: the task's page lists b,
    with its own two, but counts and draws the task's events once."""
    path, ids = log
    page_data = load_task(path, "task.rc")
    assert page_data is not None
    assert {x.id: x.events for x in page_data.exchanges}[ids["b"]] == 2
    assert ids["b"] not in {e.exchange_id for e in page_data.events}
    assert ids["a"] in {e.exchange_id for e in page_data.events}


def test_every_outcome_has_a_colour_and_a_label_of_its_own() -> None:
    assert set(RECONNECT_COLOURS) == set(ResumeOutcome)
    seen = set()
    for outcome in ResumeOutcome:
        r = Reconnect(
            id=1,
            exchange_id=1,
            at="",
            at_ms=0.0,
            side=ResumeSide.UPSTREAM,
            last_event_id="e7",
            events_from_log=3,
            new_exchange_id=2,
            outcome=outcome,
            attempts=1,
            synthesized=[],
            error=None,
        )
        label = reconnect_label(r)
        assert label != f"upstream {outcome}", outcome  # not the fallback for an unknown outcome
        seen.add(label)
        assert f"tt-rc-{outcome.replace('_', '-')}" in r.css_class
    assert len(seen) == len(ResumeOutcome)


async def test_an_artifact_only_a_subscribe_s_snapshot_holds_is_shown(tmp_path: Path) -> None:
    """A stream broke before any artifact; the subscribe that followed the task began with a
    snapshot holding one (the agent made it meanwhile): the task page shows it (it waited
    for an update of it that never came, for ever)."""
    path = tmp_path / f"{DB}.db"
    t0 = time.time_ns()
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        broke = sse([task("t.s", "c.s"), status("t.s", "c.s", "TASK_STATE_WORKING")], ids="e")
        _stream(w, cap, "/message:stream", t0, broke, outcome="upstream_disconnected", error="dropped")
        snapshot = task("t.s", "c.s")
        snapshot["task"]["artifacts"] = [
            {"artifactId": "answer", "parts": [{"text": "Hello from the snapshot"}]}
        ]
        followed = sse([snapshot, status("t.s", "c.s", "TASK_STATE_COMPLETED")], ids="s")
        _stream(w, cap, "/tasks/t.s:subscribe", t0 + 400 * MS, followed)
    async with asyncio.timeout(30):
        html = await page(create_datasette(path), f"/{DB}/-/task/t.s")
    assert "Hello from the snapshot" in html
