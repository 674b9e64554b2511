"""The inspector in process: Datasette over a real log recorded from the demo agent, with
tasktape's metadata and plugin (loaded through its entry point, as `tasktape inspect` does)."""

from __future__ import annotations

import html
import json
import re
import sqlite3
import threading
import urllib.request
from collections.abc import Awaitable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest
from a2a_frames import artifact, completed_run, sse, status, streamed, task
from datasette.app import Datasette
from datasette.database import Database
from inspector_log import BROKEN, MS, Served, page, record_log, rows, stream_of, task_of
from markupsafe import Markup

from tasktape import inspector
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.checker import check_log
from tasktape.inspector import task_page
from tasktape.inspector.app import create_datasette
from tasktape.inspector.display import STATE_COLOURS
from tasktape.inspector.metadata import HIDDEN, QUERIES, TABLES, dashboards

ROOT = Path(__file__).resolve().parent.parent
DB = "demo"


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_log(tmp_path_factory.mktemp("inspector") / f"{DB}.db")


@pytest.fixture
def ds(log: Path) -> Datasette:
    return create_datasette(log)


async def test_the_plugin_and_the_chart_plugin_are_loaded(ds: Datasette) -> None:
    plugins = {p["name"]: p for p in (await ds.client.get("/-/plugins.json")).json()}
    assert set(plugins["tasktape"]["hooks"]) >= {"render_cell", "extra_css_urls", "register_routes"}
    assert plugins["tasktape"]["static"] and plugins["tasktape"]["templates"]
    assert "datasette-dashboards" in plugins
    css = await page(ds, "/-/static-plugins/tasktape/inspector.css")
    assert "--tt-completed" in css
    assert "/-/static-plugins/tasktape/inspector.css" in await page(ds, f"/{DB}")


async def test_every_table_and_view_renders_with_its_title_description_and_facets(ds: Datasette) -> None:
    for name, meta in TABLES.items():
        html = await page(ds, f"/{DB}/{name}")
        assert meta["title"] in html and str(Markup.escape(meta["description"])) in html, name
        for description in meta["columns"].values():
            assert str(Markup.escape(description)) in html, (name, description)
        facets = (await ds.client.get(f"/{DB}/{name}.json")).json()["facet_results"]
        assert list(facets) == meta.get("facets", []), name
    # Facet values are real: the demo's tasks end in these states.
    facet = (await ds.client.get(f"/{DB}/task_summary.json")).json()["facet_results"]["final_state"]
    assert {v["value"] for v in facet["results"]} >= {
        "TASK_STATE_COMPLETED",
        "TASK_STATE_FAILED",
        "TASK_STATE_REJECTED",
        "TASK_STATE_CANCELED",
        "TASK_STATE_AUTH_REQUIRED",
    }


async def test_a_listing_runs_only_the_facets_its_metadata_names(
    ds: Datasette, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suggested facet, or a facet of task_timeline (whose gaps are a window over every
    event), reads a whole view: seconds each on a big log."""
    asked: list[str] = []
    execute = Database.execute

    async def recording(self: Database, sql: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(sql)
        return await execute(self, sql, *args, **kwargs)

    monkeypatch.setattr(Database, "execute", recording)
    for name, meta in TABLES.items():
        asked.clear()
        await page(ds, f"/{DB}/{name}")
        faceted = [
            m.group(1) for sql in asked if (m := re.search(r"select (\S+) as value, count\(\*\)", sql))
        ]
        assert sorted(faceted) == sorted(meta.get("facets", [])), name
        assert not [sql for sql in asked if "json_type(" in sql or "select date(" in sql], name
        if name == "task_timeline":
            assert not faceted


async def test_json_is_cut_on_table_pages_and_whole_on_a_row_page(ds: Datasette, log: Path) -> None:
    stream = stream_of(log, "completed")
    with EventLog(log) as opened:
        (longest,) = opened.db.query(
            "SELECT seq, data FROM events WHERE exchange_id = ? ORDER BY length(data) DESC LIMIT 1", [stream]
        )
    whole = json.dumps(json.loads(longest["data"]), indent=2, ensure_ascii=False)
    cut = ds.setting("truncate_cells_html")
    assert len(whole) > cut
    listed = await page(ds, f"/{DB}/events?exchange_id={stream}&_size=max")
    cells = re.findall(r'<pre class="tt-json">(.*?)</pre>', listed, re.S)
    assert len(cells) > 40 and all(len(html.unescape(c)) <= cut + 1 for c in cells)  # data and usage
    assert str(Markup.escape(whole[:cut])) + "\u2026</pre>" in listed
    one = await page(ds, f"/{DB}/events/{stream},{longest['seq']}")
    assert f'<pre class="tt-json">{Markup.escape(whole)}</pre>' in one


async def test_tasks_answered_without_a_stream_are_listed(ds: Datasette, log: Path) -> None:
    not_streamed, dropped = task_of(log, "not streamed"), task_of(log, "dropped")
    tasks = {t["task_id"]: t for t in await rows(ds, f"/{DB}/task_summary.json?_shape=objects&_size=max")}
    assert len(tasks) == 13  # the demo's twelve and the broken one
    answered = tasks[not_streamed]
    assert (answered["final_state"], answered["events"], answered["exchanges"]) == (
        "TASK_STATE_COMPLETED",
        0,
        1,
    )
    assert answered["answer"].startswith("About Summarise the last visit") and answered["credits"] > 0
    # The stream dropped mid-answer; the GetTask after it says how the task ended.
    assert tasks[dropped]["final_state"] == "TASK_STATE_COMPLETED"
    got = await rows(ds, f"/{DB}/task_answers.json?_shape=objects")
    assert {(r["task_id"], r["state"]) for r in got} >= {
        (not_streamed, "TASK_STATE_COMPLETED"),
        (dropped, "TASK_STATE_COMPLETED"),
    }
    html = await page(ds, f"/{DB}/task_answers")
    assert (
        f'<a class="tt-task" href="/{DB}/-/task/{not_streamed}">' in html and '<pre class="tt-json">' in html
    )


async def test_internal_tables_are_hidden_and_foreign_keys_show_labels(ds: Datasette, log: Path) -> None:
    tables = {t["name"]: t["hidden"] for t in (await ds.client.get(f"/{DB}.json")).json()["tables"]}
    assert {name for name, hidden in tables.items() if hidden} == set(HIDDEN)
    assert not any(tables[name] for name in ("captures", "exchanges", "stored_chunks", "events", "findings"))
    # An event's exchange shows as a link labelled with the exchange's path.
    stream = stream_of(log, "completed")
    html = await page(ds, f"/{DB}/events?exchange_id={stream}")
    assert f'<a href="/demo/exchanges/{stream}">/message:stream</a>' in html


def test_every_table_and_column_of_the_log_is_described_or_hidden(log: Path) -> None:
    with EventLog(log) as opened:
        for name in opened.db.table_names() + opened.db.view_names():
            if name not in HIDDEN:
                assert name in TABLES, name
                columns = {c.name for c in opened.db[name].columns}
                assert columns <= set(TABLES[name]["columns"]), (name, columns - set(TABLES[name]["columns"]))


async def test_full_text_search_finds_a_token_and_sees_through_the_search_box(ds: Datasette) -> None:
    found = await rows(ds, f"/{DB}/events.json?_search=J45.909&_shape=objects")
    assert found and all("J45.909" in r["text"] for r in found)
    assert 'name="_search"' in await page(ds, f"/{DB}/events")
    assert not await rows(ds, f"/{DB}/events.json?_search=zebra&_shape=objects")
    # Text FTS5 cannot read as a query matches nothing, as in the canned search, not a 400.
    for text in ('"', '""', "%00", "J45.909%00", " "):
        assert await rows(ds, f"/{DB}/events.json?_search={text}&_shape=objects") == [], text
    assert await rows(ds, f"/{DB}/events.json?_search=%22J45.909&_shape=objects") == found


async def test_canned_queries_take_their_parameters(ds: Datasette, log: Path) -> None:
    db = (await ds.client.get(f"/{DB}.json")).json()
    assert [q["name"] for q in db["queries"]] == list(QUERIES)
    for name, query in QUERIES.items():
        html = await page(ds, f"/{DB}/{name}")
        assert query["title"] in html
        for param in re.findall(r":(\w+)", query["sql"]):
            assert f'name="{param}"' in html, (name, param)
    completed = task_of(log, "completed")
    timeline = await rows(ds, f"/{DB}/task_timeline_of.json?task_id={completed}&_shape=objects")
    assert len(timeline) == 40 and timeline[0]["state"] == "TASK_STATE_SUBMITTED"
    assert timeline[-1]["state"] == "TASK_STATE_COMPLETED"
    # Any case, with or without the prefix, words joined as A2A 0.3 joins them (-) too.
    for state, expected in [
        ("failed", 3),
        ("FAILED", 3),
        ("TASK_STATE_FAILED", 3),
        ("auth required", 1),
        ("auth-required", 1),
        ("task-state-auth-required", 1),
    ]:
        tasks = await rows(ds, f"/{DB}/tasks_by_final_state.json?state={state}&_shape=objects")
        assert len(tasks) == expected, state
        assert {t["final_state"] for t in tasks} == {
            "TASK_STATE_" + re.sub("[ -]", "_", state.upper()).removeprefix("TASK_STATE_")
        }
    slowest = await rows(ds, f"/{DB}/slowest_first_event.json?at_least_ms=&_shape=objects")
    assert len(slowest) == 13  # every stream: the demo's twelve and the broken one
    assert [r["ttfe_ms"] for r in slowest] == sorted((r["ttfe_ms"] for r in slowest), reverse=True)
    assert not await rows(ds, f"/{DB}/slowest_first_event.json?at_least_ms=60000&_shape=objects")
    found = await rows(ds, f"/{DB}/search_event_text.json?text=knowledge+base&_shape=objects")
    assert found and all("[knowledge base]" in r["matched"] for r in found)
    found = await rows(ds, f"/{DB}/search_event_text.json?text=J45.909&_shape=objects")
    assert found and all("[J45.909]" in r["matched"] for r in found)
    # FTS syntax in the text is read as words, not as a query (which would fail here).
    assert await rows(ds, f"/{DB}/search_event_text.json?text=J45.909+AND+(%22&_shape=objects") == []


async def test_a_canned_querys_number_must_be_one_and_text_with_a_nul_matches_nothing(ds: Datasette) -> None:
    def slowest(at_least: str) -> Awaitable[list[dict[str, Any]]]:
        return rows(ds, f"/{DB}/slowest_first_event.json?at_least_ms={quote(at_least)}&_shape=objects")

    every = await slowest("")
    assert len(every) == 13 and await slowest(" ") == every
    third = every[2]["ttfe_ms"]
    assert [r["exchange_id"] for r in await slowest(f" {third} ")] == [r["exchange_id"] for r in every[:3]]
    assert await slowest("0e3") == every  # a number as SQLite reads one
    for not_a_number in ("abc", "1,000", f"{third}abc", "0x10"):
        assert await slowest(not_a_number) == [], not_a_number  # CAST would read 0, 1, third, 0
    for text in ("%00", "J45.909%00", "%00J45.909"):
        assert await rows(ds, f"/{DB}/search_event_text.json?text={text}&_shape=objects") == [], text


async def test_render_cell_colours_states_links_tasks_and_shows_ms_and_json(ds: Datasette, log: Path) -> None:
    completed = task_of(log, "completed")
    html = await page(ds, f"/{DB}/events?exchange_id={stream_of(log, 'completed')}&_size=3")
    assert '<span class="tt-pill tt-s-submitted" title="TASK_STATE_SUBMITTED">SUBMITTED</span>' in html
    assert f'<a class="tt-task" href="/{DB}/-/task/{completed}">{completed}</a>' in html
    assert re.search(r'<span class="tt-ms" title="[\d,]+ ns">[\d,]+\.\d{3} ms</span>', html)
    assert '<pre class="tt-json">{\n  &#34;task&#34;: {' in html
    summary = await page(ds, f"/{DB}/task_summary")
    assert 'class="tt-pill tt-s-completed"' in summary and 'class="tt-pill tt-s-auth-required"' in summary
    assert re.search(r'<a href="/demo/exchanges/\d+">\d+</a>', await page(ds, f"/{DB}/exchange_metrics"))

    def cell(value: Any, column: str, table: str | None = "events", database: str = DB) -> Any:
        return inspector.render_cell(
            row={}, value=value, column=column, table=table, database=database, datasette=ds
        )

    assert cell("TASK_STATE_INPUT_REQUIRED", "final_state", "task_summary") == Markup(
        '<span class="tt-pill tt-s-input-required" title="TASK_STATE_INPUT_REQUIRED">INPUT_REQUIRED</span>'
    )
    assert cell("task/1", "task_id", None) == Markup(
        '<a class="tt-task" href="/demo/-/task/task%2F1">task/1</a>'
    )
    assert cell(1_382_087_899, "duration_ns", "exchanges") == Markup(
        '<span class="tt-ms" title="1,382,087,899 ns">1,382.088 ms</span>'
    )
    assert cell('{"a": [1, "<b>"]}', "data") == Markup(
        '<pre class="tt-json">{\n  &#34;a&#34;: [\n    1,\n    &#34;&lt;b&gt;&#34;\n  ]\n}</pre>'
    )
    assert cell(7, "exchange_id", "task_timeline") == Markup('<a href="/demo/exchanges/7">7</a>')
    # Left to Datasette: other values, an FK cell (already a link), text that is not JSON.
    assert cell("working", "state") is None
    assert cell({"value": 7, "label": "/x"}, "exchange_id") is None
    assert cell("not {json", "data") is None
    assert cell(None, "task_id") is None


async def test_other_databases_are_left_alone(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (task_id TEXT, state TEXT, data TEXT)")
        conn.execute("INSERT INTO t VALUES ('task.x', 'TASK_STATE_WORKING', '{\"a\": 1}')")
    ds = Datasette([str(other)])
    html = await page(ds, "/other/t")
    assert "tt-pill" not in html and "tt-task" not in html and "tt-json" not in html
    await page(ds, "/other/-/task/task.x", status=404)


async def test_the_task_page_shows_the_whole_run(ds: Datasette, log: Path) -> None:
    completed, x = task_of(log, "completed"), stream_of(log, "completed")
    html = await page(ds, f"/{DB}/-/task/{completed}")
    assert f"<title>Task {completed} · {DB}</title>" in html
    assert "What does J45.909 mean?" in html  # what was asked
    # The time axis: one lane for the stream, every event a mark, the think-time gap measured.
    (svg,) = re.findall(r'<svg class="tt-timeline".*?</svg>', html, re.S)
    assert f"#{x} SendStreamingMessage" in svg
    assert len(re.findall(rf"<title>#{x}\.\d+ at", svg)) == 40
    gap = re.search(r'class="tt-gap-label"[^>]*>([\d,]+) ms<', svg)
    assert gap and int(gap.group(1).replace(",", "")) >= 20  # the agent thinks before its first token
    for label in ("SUBMITTED", "WORKING", "COMPLETED", "thinking · 11", "answer · 26"):
        assert f">{label}<" in svg, label
    # The state changes in order, each linked to its event.
    states = re.findall(r'<li>\s*<span class="tt-pill [^"]+" title="(\w+)"', html)
    assert states == ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]
    assert f'href="/{DB}/events/{x},39">#{x}.39</a>' in html
    # The answer (with its citation resolved) apart from the intermediate thinking.
    answer, thinking = html.split("<h2>Intermediate thinking</h2>")
    answer = answer.split("<h2>Answer</h2>")[1]
    assert "About What does J45.909 mean: the answer is assembled" in answer
    assert "Looking up What does J45.909 mean in the knowledge base." in thinking.split("</section>")[0]
    assert "Looking up" not in answer
    assert re.search(r'<a class="tt-cite" href="#cite-1-1" title="/results/0">\[1\]</a>', answer)
    assert "&#34;source&#34;: &#34;demo knowledge base&#34;" in answer
    # Usage and credits, findings, exchanges, the events with their gaps.
    assert re.search(r"<th>credits</th><td>1\.\d+</td>", html)
    assert re.search(r"<th>model</th><td>tasktape-demo-1</td>", html)
    assert "The lifecycle checks find nothing wrong" in html
    assert html.count('class="tt-gapbar"') == 39
    assert html.count(f'href="/{DB}/events/{x},') >= 40


async def test_a_task_across_streams_and_requests(ds: Datasette, log: Path) -> None:
    resumed = await page(ds, f"/{DB}/-/task/{task_of(log, 'resumed')}")
    (svg,) = re.findall(r'<svg class="tt-timeline".*?</svg>', resumed, re.S)
    assert svg.count('class="tt-lane-title"') == 2  # the first stream and the one that resumed it
    assert "Which record should I use?" in resumed  # the agent's reason for INPUT_REQUIRED
    assert "What input do you need?" in resumed and "Record 42" in resumed
    canceled = await page(ds, f"/{DB}/-/task/{task_of(log, 'canceled')}")
    assert ">other requests<" in canceled and "CancelTask" in canceled
    assert "never closed" in canceled  # the answer was cut off by the cancel
    assert re.search(r"CANCELED</span>\s*<span class=\"tt-at\">", canceled)
    dropped = await page(ds, f"/{DB}/-/task/{task_of(log, 'dropped')}")
    assert "upstream_disconnected" in dropped
    # The frame the dropped connection cut in two names no task, but it is the task's.
    assert '<b class="tt-warn">cut off</b>' in dropped and "not JSON: Unterminated string" in dropped
    assert 'class="tt-cut"' in dropped
    assert "GetTask x" in dropped  # the client polled until the task completed
    # The stream broke off while WORKING; a GetTask response showed it COMPLETED.
    last = dropped.split('<ol class="tt-states">')[1].split("</ol>")[0].split("<li>")[-1]
    assert 'title="TASK_STATE_COMPLETED"' in last and "in the response of" in last


async def test_the_task_page_counts_and_times_the_task_as_the_tasks_view_does(
    ds: Datasette, log: Path
) -> None:
    summary = {t["task_id"]: t for t in await rows(ds, f"/{DB}/task_summary.json?_shape=objects&_size=max")}
    for task_id, row in summary.items():
        html = await page(ds, f"/{DB}/-/task/{task_id}")
        events = re.search(r'"tt-label">events</span><strong>(\d+)</strong>', html)
        seen = re.search(r'"tt-label">last seen after</span><strong>([\d,]+) ms</strong>', html)
        assert events and int(events.group(1)) == row["events"], task_id
        assert seen and int(seen.group(1).replace(",", "")) == round(row["duration_ms"]), task_id
    # The cut-off frame of the dropped stream is drawn, and said to name no task.
    dropped = await page(ds, f"/{DB}/-/task/{task_of(log, 'dropped')}")
    assert "1 more drawn that names no task" in dropped


async def test_a_state_the_tasks_stream_sent_without_its_id_is_shown(tmp_path: Path) -> None:
    """A subscribe to task T whose statusUpdate names no task: its exchange is T's (by the
    path), so the state is T's."""
    path = tmp_path / "noid.db"
    frames = [task("T", "c"), {"statusUpdate": {"status": {"state": "TASK_STATE_FAILED"}}}]
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        ex = w.begin_exchange(cap, method="POST", path="/tasks/T:subscribe")
        w.response_head(ex, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=1)
        for n, data in enumerate(sse(frames), 1):
            w.chunk(ex, n * 1000, data)
        w.end_exchange(ex, duration_ns=10_000)
    html = await page(create_datasette(path), "/noid/-/task/T")
    states = re.findall(r'<li>\s*<span class="tt-pill [^"]+" title="(\w+)"', html)
    assert states == ["TASK_STATE_WORKING", "TASK_STATE_FAILED"]


def test_a_task_polled_many_times_is_read_in_one_pass_over_its_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream, then a GetTask poll after poll: each exchange's events are counted once
    over all of them, not by reading every event again per exchange."""
    path, polls = tmp_path / "polled.db", 50
    body = json.dumps({"id": "task.1", "contextId": "ctx.1", "status": {"state": "TASK_STATE_WORKING"}})
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream")
        w.response_head(ex, status=200, headers={}, is_sse=True, ttfb_ns=1)
        w.chunk(ex, 1000, b"".join(sse(completed_run())))
        w.end_exchange(ex, duration_ns=10_000)
        for _ in range(polls):
            get = w.begin_exchange(cap, method="GET", path="/tasks/task.1")
            w.response_head(
                get, status=200, headers={"content-type": "application/json"}, is_sse=False, ttfb_ns=1
            )
            w.chunk(get, 1000, body.encode())
            w.end_exchange(get, duration_ns=2000)
    passes = []

    class Passes(list[task_page.Event]):
        def __iter__(self) -> Iterator[task_page.Event]:
            passes.append(1)
            return super().__iter__()

    read = task_page._events
    monkeypatch.setattr(task_page, "_events", lambda rows, origin: Passes(read(rows, origin)))
    loaded = task_page.load_task(path, "task.1")
    assert loaded is not None and len(loaded.exchanges) == polls + 1
    assert [x.events for x in loaded.exchanges] == [len(completed_run())] + [0] * polls
    assert len(passes) < 5


async def test_a_task_answered_without_a_stream(ds: Datasette, log: Path) -> None:
    html = await page(ds, f"/{DB}/-/task/{task_of(log, 'not streamed')}")
    assert "in the response of" in html and "TASK_STATE_COMPLETED" in html
    assert "About Summarise the last visit" in html and "Looking up Summarise the last visit" in html
    assert "demo knowledge base" in html and "<th>credits</th>" in html


async def test_an_answer_a_gettask_recovered_after_the_stream_dropped_is_shown(
    ds: Datasette, log: Path
) -> None:
    """The stream dropped mid-answer, after the thinking; the GetTask after it holds the
    whole answer, which the page shows as task_summary reads it."""
    dropped = task_of(log, "dropped")
    (summary,) = await rows(ds, f"/{DB}/task_summary.json?_shape=objects&task_id={quote(dropped)}")
    assert summary["answer"].startswith("About the line mid answer")
    data = json.loads(await page(ds, f"/{DB}/-/task/{dropped}.json"))
    answers = [a["text"] for a in data["artifacts"] if a["type"] != "intermediate-thinking"]
    assert "\n".join(answers) == summary["answer"]
    shown = await page(ds, f"/{DB}/-/task/{dropped}")
    assert "No answer artifact." not in shown and "About the line mid answer" in shown


async def test_the_task_page_shows_the_checkers_findings(ds: Datasette, log: Path) -> None:
    with EventLog(log) as opened:
        (exchange,) = [x["id"] for x in opened.exchanges() if x["task_id"] == BROKEN]
        expected = check_log(opened, [exchange])
    assert {f.rule for f in expected} >= {"after-terminal", "transition"}
    html = await page(ds, f"/{DB}/-/task/{BROKEN}")
    findings = html.split("<h2>Findings</h2>")[1].split("</section>")[0]
    for f in expected:
        assert f"<b>{f.rule}</b>" in findings and str(Markup.escape(f.message)) in findings
        if f.seq is not None:
            assert f'href="/{DB}/events/{f.exchange_id},{f.seq}"' in findings
    assert "tt-card tt-bad" in html


async def test_unknown_tasks_and_databases_are_404(ds: Datasette) -> None:
    await page(ds, f"/{DB}/-/task/task.nope", status=404)
    await page(ds, "/nope/-/task/task.nope", status=404)
    # An id with a % in it is named as asked (Datasette would redirect it to a tilde-encoded
    # URL, whose 404 named another id).
    assert "no task task%20nope in demo" in await page(ds, f"/{DB}/-/task/task%2520nope", status=404)
    missing = await ds.client.get(f"/{DB}/-/task/task%2520nope.json")
    assert missing.status_code == 404 and missing.json()["error"] == "no task task%20nope in demo"


DOT_IDS = ["..", ".", "~2E~2E"]  # two a browser resolves as a path, one spelt as their links


def one_task_each(path: Path, task_ids: list[str], context_id: str = "c") -> Path:
    """A log of a short stream per task."""
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        for task_id in task_ids:
            ex = w.begin_exchange(cap, method="POST", path="/message:stream")
            w.response_head(
                ex, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=1
            )
            for n, data in enumerate(sse(completed_run(task_id, context_id)), 1):
                w.chunk(ex, n * 1000, data)
            w.end_exchange(ex, duration_ns=10_000)
    return path


async def test_tasks_named_dot_and_dot_dot_are_linked_to_their_pages(tmp_path: Path) -> None:
    """A browser resolves a path segment of dots (``%2E%2E`` too) before it asks: the link
    to the task ``..`` must not be ``/-/task/..``, which opens the database's page."""
    ds = create_datasette(one_task_each(tmp_path / "dots.db", DOT_IDS))
    listing = await page(ds, "/dots/task_summary")
    for task_id in DOT_IDS:
        (href,) = re.findall(rf'<a class="tt-task" href="([^"]+)">{re.escape(task_id)}</a>', listing)
        assert set(unquote(href.rsplit("/", 1)[1])) != {"."}, href  # not a dot segment
        assert f"<h1>Task <code>{task_id}</code></h1>" in await page(ds, href)
        assert (await ds.client.get(f"{href}.json")).json()["task_id"] == task_id


async def test_a_task_whose_id_is_empty_is_linked_to_its_page(tmp_path: Path) -> None:
    """A link to the task "" ending in ``/-/task/`` names no page (Datasette redirects it
    to a table named ``-``): the empty id has a form of its own, and an id spelt like that
    form keeps its page."""
    ds = create_datasette(one_task_each(tmp_path / "empty.db", ["", "~"]))
    listing = await page(ds, "/empty/task_summary")
    for task_id, form in [("", "~"), ("~", "%7E")]:
        (href,) = re.findall(rf'<a class="tt-task" href="([^"]+)">{re.escape(task_id)}</a>', listing)
        assert href == f"/empty/-/task/{form}"
        assert f"<h1>Task <code>{task_id}</code></h1>" in await page(ds, href)
        assert (await ds.client.get(f"{href}.json")).json()["task_id"] == task_id


def test_a_log_named_as_a_database_of_datasettes_own_is_served_where_it_says(tmp_path: Path) -> None:
    """Datasette keeps ``_memory`` and ``_internal`` for itself and serves a log of that
    name as ``_memory_2``: the metadata and the printed URLs name it so, and every printed
    URL opens its page."""
    log = one_task_each(tmp_path / "_memory.db", ["T"])
    inspector = Served("inspect", str(log), "--port", "0")
    try:
        url = inspector.wait_for_url()
        printed = dict(re.findall(r"^  (\w+) +(\S+)$", inspector.out, re.M))
        assert printed["tasks"] == f"{url}/_memory_2/task_summary"
        for where in printed.values():
            with urllib.request.urlopen(where) as response:
                assert response.status == 200, where
        with urllib.request.urlopen(printed["tasks"]) as response:
            html = response.read().decode()
        described = str(Markup.escape(TABLES["task_summary"]["description"]))  # its metadata's
        assert described in html and 'href="/_memory_2/-/task/T"' in html
    finally:
        assert inspector.stop()[0] == 0


async def test_right_to_left_text_in_an_id_is_isolated_from_the_line_around_it(tmp_path: Path) -> None:
    """A context id holding an override and right-to-left words would take the "1" of
    " · 1 exchange" into it: ids in code are bidi isolates, as the stylesheet says."""
    context = "ctx-\u202eevil\u202c مرحبا עברית"
    ds = create_datasette(one_task_each(tmp_path / "rtl.db", ["T"], context))
    html = await page(ds, "/rtl/-/task/T")
    assert re.search(rf"<code>{re.escape(context)}</code></a> ·\s+1 exchange", html)
    assert 'class="tt-task-page"' in html
    css = (await ds.client.get("/-/static-plugins/tasktape/inspector.css")).text
    isolated = [rule.split("{")[0] for rule in css.split("}") if re.search(r"unicode-bidi:\s*isolate", rule)]
    selectors = {
        s.strip() for rule in isolated for s in re.sub(r"/\*.*?\*/", "", rule, flags=re.S).split(",")
    }
    assert {".tt-task-page code", ".tt-session-page code", "a.tt-task", ".tt-evtext"} <= selectors


async def test_the_task_page_has_its_data_as_json_beside_it(ds: Datasette, log: Path) -> None:
    dropped = task_of(log, "dropped")
    got = (await ds.client.get(f"/{DB}/-/task/{dropped}.json")).json()
    loaded = task_page.load_task(log, dropped)
    assert loaded is not None and got == json.loads(json.dumps(asdict(loaded), default=str))
    assert got["task_id"] == dropped and got["states"][-1]["state"] == "TASK_STATE_COMPLETED"
    # A task whose id ends in .json is linked with its dot escaped: its page, not JSON.
    assert inspector.task_path(ds, DB, "t.json") == f"/{DB}/-/task/t%2Ejson"


async def test_the_dashboard_draws_its_charts_from_real_queries(ds: Datasette) -> None:
    config = dashboards(DB)["streams"]
    assert ds.plugin_config("datasette-dashboards") == dashboards(DB)
    html = await page(ds, "/-/dashboards/streams")
    assert config["title"] in html and "vega-lite.min.js" in html
    database = ds.get_database(DB)
    for slug, chart in config["charts"].items():
        assert f'id="chart-{slug}"' in html
        result = await database.execute(chart["query"])
        assert result.rows, slug
        encoding = chart["display"].get("encoding", {})
        fields = {e["field"] for e in encoding.values()} | (
            {chart["display"]["field"]} if chart["library"] == "metric" else set()
        )
        assert fields <= set(result.columns), slug
    assert await page(ds, "/-/dashboards/streams/ttfe")
    assert await page(ds, "/-/static-plugins/datasette_dashboards/vega-lite.min.js")


def test_the_stylesheet_and_the_charts_use_the_same_state_colours() -> None:
    css = (ROOT / "inspector" / "static" / "inspector.css").read_text()
    for state, colour in STATE_COLOURS.items():
        name = state.removeprefix("TASK_STATE_").lower().replace("_", "-")
        assert f"--tt-{name}: {colour};" in css, state


async def test_the_log_is_read_only_and_live_while_a_recorder_writes(tmp_path: Path) -> None:
    path = tmp_path / "live.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")

        def stream(task_id: str) -> None:
            ex = w.begin_exchange(cap, method="POST", path="/message:stream")
            w.response_head(ex, status=200, headers={}, is_sse=True, ttfb_ns=1)
            for n, data in enumerate(sse(completed_run(task_id)), 1):
                w.chunk(ex, n * 1000, data)
            w.end_exchange(ex, duration_ns=10_000)
            w.flush()

        stream("task.first")
        ds = create_datasette(path)
        tasks = await rows(ds, "/live/task_summary.json?_shape=objects")
        assert [t["task_id"] for t in tasks] == ["task.first"]
        stream("task.second")  # recorded while the inspector is open
        tasks = await rows(ds, "/live/task_summary.json?_shape=objects")
        assert [t["task_id"] for t in tasks] == ["task.first", "task.second"]
        found = await rows(ds, "/live/search_event_text.json?text=intermittent+asthma&_shape=objects")
        assert {r["task_id"] for r in found} == {"task.first", "task.second"}
        await page(ds, "/live/-/task/task.second")
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            await ds.get_database("live").execute_write("DELETE FROM events")
    with EventLog(path) as log:
        assert log.db.execute("SELECT count(*) FROM events").fetchone()[0] == 2 * len(completed_run())


async def test_a_task_page_read_while_its_stream_is_written_agrees_with_itself(tmp_path: Path) -> None:
    """A recorder writes the task's stream while its page is asked for again and again:
    each page is read as the log was at one moment, so its figures agree (the events it
    lists are those task_summary counts, and no reconnect's slice is said drawn once)."""
    path, renders = tmp_path / "writing.db", 12
    stop = threading.Event()
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream")
        w.response_head(ex, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=1)
        w.chunk(ex, 1000, b"".join(sse([task("T", "c"), status("T", "c", "TASK_STATE_WORKING")])))
        w.flush()

        def write() -> None:  # each delta committed alone, until the pages are read
            for n in range(3, 100_000):
                if stop.is_set():
                    return
                w.chunk(ex, n * 1000, sse([artifact("T", "c", "a", f"w{n} ", append=n > 3)], start=n)[0])
                w.flush()

        writer = threading.Thread(target=write)
        writer.start()
        try:
            ds = create_datasette(path)
            counted = []
            for _ in range(renders):
                got = (await ds.client.get("/writing/-/task/T.json")).json()
                assert got["recorded_events"] == len(got["events"])
                assert got["seen_ms"] == round(got["events"][-1]["at_ms"], 3)
                html = await page(ds, "/writing/-/task/T")
                figure = re.search(r'"tt-label">events</span><strong>(\d+)</strong>', html)
                left_out = re.search(r"([\d,]+) more events, left out here", html)
                listed = html.count('<tr class="tt-ev-') + (
                    int(left_out.group(1).replace(",", "")) if left_out else 0
                )
                assert figure and int(figure.group(1)) == listed
                assert "drawn once" not in html
                counted.append(got["recorded_events"])
        finally:
            stop.set()
            writer.join()
        w.end_exchange(ex, duration_ns=10**9)
    assert counted[-1] > counted[0]  # the pages were read while the stream was written


async def test_a_task_whose_stream_is_still_coming_is_said_to_be_open(tmp_path: Path) -> None:
    """Its exchange has no end in the log yet: the page says it is open and streaming, not
    when its exchanges ended, and its artifact not closed yet is streaming, not never closed."""
    path = tmp_path / "open.db"
    frames = [
        task("T", "c"),
        status("T", "c", "TASK_STATE_WORKING"),
        *streamed("T", "c", "a", ["Hel", "lo"], close=False),
    ]
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream")
        w.response_head(ex, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=1)
        for n, data in enumerate(sse(frames), 1):
            w.chunk(ex, n * 100 * MS, data)
        w.flush()
        ds = create_datasette(path)
        html = await page(ds, "/open/-/task/T")
        assert f"#{ex} still open: the log holds no end of it yet" in html and "end after" not in html
        row = html.split("<h2>Exchanges</h2>")[1].split("</tr>", 2)[1]
        assert re.search(r"<td[^>]*>still open</td>\s*<td[^>]*>4</td>\s*<td>still streaming</td>", row)
        answer = html.split("<h2>Answer</h2>")[1].split("</article>")[0]
        assert "2 events · still streaming" in answer and "never closed" not in html
        w.end_exchange(ex, duration_ns=500 * MS)
    html = await page(ds, "/open/-/task/T")
    assert "its exchanges end after 500 ms" in html and "still open" not in html
    assert "never closed" in html.split("<h2>Answer</h2>")[1] and "still streaming" not in html


async def test_an_artifact_that_came_whole_in_a_response_says_where(ds: Datasette, log: Path) -> None:
    """A task answered without a stream, and one whose dropped stream a GetTask made whole:
    their artifacts came whole in the response of an exchange, as the state changes say,
    not in events, and no lastChunk closed them."""
    for scenario, operation in (("not streamed", "SendMessage"), ("dropped", "GetTask")):
        task_id = task_of(log, scenario)
        got = (await ds.client.get(f"/{DB}/-/task/{task_id}.json")).json()
        (answered_in,) = [x["id"] for x in got["exchanges"] if x["rpc_method"] == operation][-1:]
        assert [a["answered_in"] for a in got["artifacts"]] == [answered_in] * len(got["artifacts"])
        assert not any(a["closed"] for a in got["artifacts"])  # (the log holds no lastChunk of them)
        html = await page(ds, f"/{DB}/-/task/{task_id}")
        lines = re.findall(
            r'<span class="tt-meta">(.*?)</span></div>', html.split("<h2>Answer</h2>")[1], re.S
        )
        streamed = {a["events"] for a in got["artifacts"]} - {0}
        whole = f'whole in the response of <a href="/{DB}/exchanges/{answered_in}">#{answered_in}</a>'
        assert sorted(lines) == sorted(
            (f"{a['events']} events · " if a["events"] else "") + whole for a in got["artifacts"]
        ), lines
        assert bool(streamed) == (scenario == "dropped")  # the thinking streamed before the drop


async def test_the_charts_add_up_counts_past_64_bits(tmp_path: Path) -> None:
    """Two streams of the same model, each counting input tokens and credits SQLite holds
    (2**63 - 1, 2**62), add up past 64 bits: the tokens chart's query and the credits
    metric's failed with "integer overflow", and the dashboard drew neither."""
    path = tmp_path / "counts.db"
    usage = {"model": "m-1", "inputTokens": 2**63 - 1, "outputTokens": 2, "credits": 2**62}
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        for task_id in ("t1", "t2"):
            ex = w.begin_exchange(cap, method="POST", path="/message:stream")
            w.response_head(
                ex, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=1
            )
            frames = [task(task_id, "c"), status(task_id, "c", "TASK_STATE_COMPLETED", usage=usage)]
            w.chunk(ex, 1000, b"".join(sse(frames)))
            w.end_exchange(ex, duration_ns=10_000)
    ds = create_datasette(path)
    charts = dashboards("counts")["streams"]["charts"]
    got = {}
    for slug in ("tokens", "credits"):
        query = quote(charts[slug]["query"])
        got[slug] = await rows(ds, f"/counts.json?sql={query}&_shape=objects")
    assert sorted((r["tokens_of"], r["tokens"]) for r in got["tokens"]) == [
        ("input", 2.0 * (2**63 - 1)),
        ("output", 4.0),
    ]
    assert got["credits"] == [{"n": 2.0 * 2**62}]
