"""Shows the record: the Datasette plugin (these hooks, templates/, static/), the metadata,
and a page per A2A task, per MCP session and per LLM stream. The lifecycle checker it
shows findings of lives in ``tasktape.eventlog.checker``, so checking a log needs no
Datasette.

The hooks act only on databases served with tasktape's metadata (``tasktape inspect``),
so other Datasette databases in the same environment are left as they are.
"""

from __future__ import annotations

import asyncio
import math
import re
import sqlite3
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import asdict
from typing import Any
from urllib.parse import quote, unquote

from datasette import hookimpl
from datasette.database import Database
from datasette.utils import escape_fts, tilde_decode
from datasette.utils.asgi import NotFound, Request, Response
from markupsafe import Markup

from tasktape.eventlog.protocols import ProtocolName

from .display import (
    JSON_COLUMNS,
    NS_COLUMNS,
    STATE_COLUMNS,
    excerpt,
    ms,
    pretty_json,
    row_number,
    short_state,
    state_class,
)
from .metadata import PLUGIN, VIEWS
from .session_page import PLACE_ON_PAGE, load_session
from .session_timeline import MARK_COLOURS, drawn_calls, session_svg
from .stream_page import LLM_PROTOCOLS, load_stream
from .stream_timeline import CATEGORY_COLOURS as STREAM_COLOURS
from .stream_timeline import stream_svg
from .task_page import load_task
from .timeline import CATEGORY_COLOURS, colour, reconnect_colour, timeline_svg

STATIC = "tasktape"  # static files are served under the distribution's name
# A task page's events table shows the first EVENT_ROWS events and the last EVENT_TAIL,
# its exchanges table (a task polled thousands of times) the first EXCHANGE_ROWS and the
# last EXCHANGE_TAIL, as a session's page does; Datasette's tables page through the rest.
EVENT_ROWS = 500
EVENT_TAIL = 20
EXCHANGE_ROWS = 200
EXCHANGE_TAIL = 20
# The characters of an answer or thinking the page shows (the page's JSON has all of them).
ARTIFACT_CHARS = 20_000


def is_event_log(datasette: Any, database: str | None) -> bool:
    return database is not None and datasette.plugin_config(PLUGIN, database=database) is not None


def task_path(datasette: Any, database: str, task_id: str) -> str:
    return f"{datasette.urls.database(database)}/-/task/{_path_id(task_id)}"


def session_path(datasette: Any, database: str, session_id: str) -> str:
    return f"{datasette.urls.database(database)}/-/session/{_path_id(session_id)}"


# The ids a URL cannot hold quoted, in a form of their own. A browser resolves a path
# segment of dots (percent-encoded ones too: ``%2E%2E``) before it asks, so their dots are
# tilde-encoded, as Datasette encodes its own URLs; the empty id would leave the page's
# path without its last segment, so it is a lone ``~``.
_TILDE_IDS = {"": "~", ".": "~2E", "..": "~2E~2E"}
_IDS_OF = {encoded: plain for plain, encoded in _TILDE_IDS.items()}


def _path_id(value: str) -> str:
    """An id as a page's URL holds it: quoted, a final ``.json`` escaped (a page's JSON is
    at its URL with ``.json`` added), the ids ``.``, ``..`` and the empty one
    tilde-encoded, and the ``~`` of an id spelt like one of those percent-encoded."""
    if value in _TILDE_IDS:
        return _TILDE_IDS[value]
    quoted = quote(value, safe="")
    if quoted.upper() in _IDS_OF:
        return quoted.replace("~", "%7E")
    return quoted[: -len(".json")] + "%2Ejson" if quoted.endswith(".json") else quoted


def _id_of(path_id: str) -> str:
    """The id a page's URL names: what _path_id made of it, read back."""
    plain = _IDS_OF.get(path_id.upper())
    return plain if plain is not None else unquote(path_id)


def stream_path(datasette: Any, database: str, exchange_id: int) -> str:
    return f"{datasette.urls.database(database)}/-/stream/{exchange_id}"


def state_pill(state: str | None) -> Markup:
    if not state:
        return Markup("")
    return Markup('<span class="tt-pill {}" title="{}">{}</span>').format(
        state_class(state), state, short_state(state)
    )


_SHOWN_BYTES = 4096  # of a chunk shown in a view's page
# A row page (/<db>/<table>/<key>) shows its JSON whole, as Datasette shows a row's other
# cells; table and query pages cut it at truncate_cells_html. render_cell is not told
# which page it draws for, so each request says it here.
_ROW_PAGE = re.compile(r"^/(?!-/)[^/]+/(?!-/)[^/]+/[^/]+$")
_WHOLE_CELLS: ContextVar[bool] = ContextVar("tasktape_whole_cells", default=False)


@hookimpl
def render_cell(
    row: Any, value: Any, column: str, table: str | None, database: str, datasette: Any
) -> Markup | Callable[[], Awaitable[Markup]] | None:
    """Task states coloured; task ids linked to their page, MCP session ids to theirs;
    exchange ids in views and queries linked to the page that shows them (an LLM stream's,
    an MCP exchange's session, else the exchange); nanosecond durations shown in ms, JSON
    indented, the bytes of a view's rows (chunks) shown as text."""
    if not is_event_log(datasette, database) or value is None:
        return None
    if column in STATE_COLUMNS and isinstance(value, str) and value.startswith("TASK_STATE_"):
        return state_pill(value)
    if column == "task_id" and isinstance(value, str):
        href = task_path(datasette, database, value)
        return Markup('<a class="tt-task" href="{}">{}</a>').format(href, value)
    if column == "session_id" and isinstance(value, str):
        href = session_path(datasette, database, value)
        return Markup('<a class="tt-session" href="{}">{}</a>').format(href, value)
    if column == "exchange_id" and isinstance(value, int) and (table is None or table in VIEWS):
        protocol = _field(row, "protocol")
        if protocol in LLM_PROTOCOLS:
            href = stream_path(datasette, database, value)
            return Markup('<a class="tt-stream" href="{}">{}</a>').format(href, value)
        if protocol == ProtocolName.MCP:
            return lambda: _session_link(datasette, database, value)
        href = datasette.urls.row(database, "exchanges", str(value))
        return Markup('<a href="{}">{}</a>').format(href, value)
    if column in NS_COLUMNS and isinstance(value, int):
        return Markup('<span class="tt-ms" title="{:,} ns">{}</span>').format(value, ms(value, 3))
    if isinstance(value, bytes) and table in VIEWS:
        # A view's row has no key to link its download to: the bytes, as text where they are.
        text = value[:_SHOWN_BYTES].decode("utf-8", "backslashreplace")
        more = "" if len(value) <= _SHOWN_BYTES else f" ... ({len(value):,} bytes)"
        return Markup('<pre class="tt-bytes">{}{}</pre>').format(text, more)
    if column in JSON_COLUMNS:
        pretty = pretty_json(value)
        if pretty is not None:
            return Markup('<pre class="tt-json">{}</pre>').format(_cut(pretty, datasette))
    return None


def _cut(text: str, datasette: Any) -> str:
    """The text as a page shows a cell: cut at truncate_cells_html, but on a row page."""
    limit = datasette.setting("truncate_cells_html")
    if _WHOLE_CELLS.get() or not limit or len(text) <= limit:
        return text
    return text[:limit] + "\u2026"


@hookimpl
def asgi_wrapper(datasette: Any) -> Callable[[Any], Any]:
    """Tells render_cell, for each request, whether it draws a row page."""

    def wrap(app: Any) -> Any:
        async def marked(scope: dict[str, Any], receive: Any, send: Any) -> None:
            path = scope.get("raw_path") or scope.get("path", "").encode()
            token = _WHOLE_CELLS.set(bool(_ROW_PAGE.match(path.decode("latin-1").partition("?")[0])))
            try:
                await app(scope, receive, send)
            finally:
                _WHOLE_CELLS.reset(token)

        return marked

    return wrap


def _field(row: Any, name: str) -> Any:
    """A column of the row being shown, if it has that column."""
    try:
        return row[name]
    except (KeyError, IndexError, TypeError):
        return None


async def _session_link(datasette: Any, database: str, exchange_id: int) -> Markup:
    """An MCP exchange's id, linked to its row on its session's page; to its row in the
    exchanges table when the page leaves it out (a big session's) or it has no page."""
    href = await _mcp_place(datasette, database, exchange_id)
    if href is None:  # not in the log (any longer): nothing to link to
        return Markup("{}").format(exchange_id)
    return Markup('<a class="tt-session" href="{}">{}</a>').format(href, exchange_id)


async def _mcp_place(datasette: Any, database: str, exchange_id: int) -> str | None:
    """Where an MCP exchange shows: its row on its session's page, else its own row."""
    result = await datasette.get_database(database).execute(PLACE_ON_PAGE, {"id": exchange_id})
    row = result.first()
    if row is None:
        return None
    if row["session"] is None or not row["listed"]:
        return datasette.urls.row(database, "exchanges", str(exchange_id))
    return f"{session_path(datasette, database, row['session'])}#exchange-{exchange_id}"


@hookimpl(trylast=True)  # after Datasette's own, which it replaces
def prepare_connection(conn: sqlite3.Connection, database: str, datasette: Any) -> None:
    """The search box takes any text: a lone ``"`` or a NUL matches nothing, not a 400."""
    if is_event_log(datasette, database):
        conn.create_function("escape_fts", 1, _search_words, deterministic=True)


def _search_words(query: str) -> str:
    """Datasette's reading of a search as words and phrases; FTS5 fails on the empty
    query that leaves (``"``) and reads a query only up to a NUL, so those match nothing."""
    if "\x00" in query:
        return _NOTHING
    return escape_fts(query) or _NOTHING


_NOTHING = '""'  # the empty phrase: a valid query no row matches


@hookimpl
def extra_css_urls(database: str | None, datasette: Any) -> list[str]:
    """The inspector's stylesheet, on every page (its classes all start with ``tt-``)."""
    return [datasette.urls.static_plugins(STATIC, "inspector.css")]


@hookimpl
def register_routes() -> list[tuple[str, Any]]:
    """The pages of a task, an MCP session and an LLM stream: ``/<database>/-/task/<task
    id>``, ``/<database>/-/session/<session id>``, ``/<database>/-/stream/<exchange id>``."""
    return [
        (r"^/(?P<database>[^/]+)/-/task/(?P<task_id>[^/]+?)(?P<as_json>\.json)?$", task_view),
        (r"^/(?P<database>[^/]+)/-/session/(?P<session_id>[^/]+?)(?P<as_json>\.json)?$", session_view),
        (r"^/(?P<database>[^/]+)/-/stream/(?P<exchange_id>[^/]+?)(?P<as_json>\.json)?$", stream_view),
    ]


def _event_log(request: Request, datasette: Any) -> tuple[str, Database]:
    """The database the page is asked of: 404 unless it is an event log."""
    name = tilde_decode(request.url_vars["database"])
    try:
        db = datasette.get_database(name)
    except KeyError:
        raise NotFound(f"no database {name}") from None
    if not is_event_log(datasette, name):
        raise NotFound(f"{name} is not served as an event log")
    return name, db


def _as_json(request: Request, page: Any) -> Response | None:
    """The page's data as JSON, when its URL ends in ``.json``."""
    if not request.url_vars.get("as_json"):
        return None
    return Response.json(_finite(asdict(page)), default=str)


def _finite(value: Any) -> Any:
    """The data with its infinities and NaNs (which a recording can hold: JSON's ``1e999``)
    as null: JSON has no word for them, and JSON.parse refuses Python's."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


async def _not_found(request: Request, datasette: Any, message: str) -> Response:
    """A 404 saying which id is unknown. (Raising NotFound would send a URL holding a %
    to Datasette's tilde-encoded form of it, and the 404 there would name another id.)"""
    error = {"ok": False, "error": message, "status": 404, "title": None}
    if request.url_vars.get("as_json"):
        return Response.json(error, status=404)
    html = await datasette.render_template(["404.html", "error.html"], error, request=request)
    return Response.html(html, status=404)


async def task_view(request: Request, datasette: Any) -> Response:
    """One task's whole run at a glance; 404 for a task the log does not know."""
    name, db = _event_log(request, datasette)
    task_id = _id_of(request.url_vars["task_id"])
    # The log is read (and the checker run) off the event loop: other pages stay live.
    page = await asyncio.to_thread(load_task, db.path, task_id)
    if page is None:
        return await _not_found(request, datasette, f"no task {task_id} in {name}")
    if as_json := _as_json(request, page):
        return as_json
    context = {
        "page": page,
        "database": name,
        "timeline": timeline_svg(page),
        "events": excerpt(page.events, EVENT_ROWS, EVENT_TAIL),
        "exchanges": excerpt(page.exchanges, EXCHANGE_ROWS, EXCHANGE_TAIL),
        # An event's text is cut where Datasette cuts a cell; its row has all of it.
        "text_chars": datasette.setting("truncate_cells_html"),
        "artifact_chars": ARTIFACT_CHARS,
        "json_url": task_path(datasette, name, task_id) + ".json",
        "pill": state_pill,
        "colour": colour,
        "reconnect_colour": reconnect_colour,
        "category_colours": CATEGORY_COLOURS,
    }
    return Response.html(await datasette.render_template("tasktape_task.html", context, request=request))


async def session_view(request: Request, datasette: Any) -> Response:
    """One MCP session's tool calls and requests; 404 for a session the log does not know."""
    name, db = _event_log(request, datasette)
    session_id = _id_of(request.url_vars["session_id"])
    page = await asyncio.to_thread(load_session, db.path, session_id)
    if page is None:
        return await _not_found(request, datasette, f"no MCP session {session_id} in {name}")
    if as_json := _as_json(request, page):
        return as_json
    context = {
        "page": page,
        "database": name,
        "timeline": session_svg(page),
        "call_lanes": len(drawn_calls(page)),
        "mark_colours": MARK_COLOURS,
    }
    return Response.html(await datasette.render_template("tasktape_session.html", context, request=request))


async def stream_view(request: Request, datasette: Any) -> Response:
    """One OpenAI or Anthropic exchange: its answer, tokens and pace; 404 for an exchange
    the log does not have, or one of another protocol (said which, and where it shows)."""
    name, db = _event_log(request, datasette)
    raw = unquote(request.url_vars["exchange_id"])
    exchange_id = row_number(raw)
    page = None if exchange_id is None else await asyncio.to_thread(load_stream, db.path, exchange_id)
    if page is None:
        return await _not_found(
            request, datasette, await _not_a_stream(datasette, name, db, raw, exchange_id)
        )
    if as_json := _as_json(request, page):
        return as_json
    context = {
        "page": page,
        "database": name,
        "timeline": stream_svg(page),
        "category_colours": STREAM_COLOURS,
    }
    return Response.html(await datasette.render_template("tasktape_stream.html", context, request=request))


async def _not_a_stream(datasette: Any, name: str, db: Database, raw: str, exchange_id: int | None) -> str:
    """Why there is no stream page for that exchange."""
    if exchange_id is None:
        return f"no exchange {raw} in {name}"
    rows = (await db.execute("SELECT protocol FROM exchanges WHERE id = ?", [exchange_id])).rows
    if not rows:
        return f"no exchange {raw} in {name}"
    (protocol,) = rows[0]
    what = f"exchange {exchange_id} is not an OpenAI or Anthropic stream (its protocol: {protocol or 'none'})"
    if protocol == ProtocolName.MCP:
        return f"{what}; it shows at {await _mcp_place(datasette, name, exchange_id)}"
    return f"{what}; its row is {datasette.urls.row(name, 'exchanges', str(exchange_id))}"
