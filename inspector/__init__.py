"""Shows the record: the Datasette plugin (these hooks, templates/, static/), the metadata
and the per-task page. The lifecycle checker it shows findings of lives in
``tasktape.eventlog.checker``, so checking a log needs no Datasette.

The hooks act only on databases served with tasktape's metadata (``tasktape inspect``),
so other Datasette databases in the same environment are left as they are.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote, unquote

from datasette import hookimpl
from datasette.utils import tilde_decode
from datasette.utils.asgi import NotFound, Request, Response
from markupsafe import Markup

from .display import (
    JSON_COLUMNS,
    NS_COLUMNS,
    STATE_COLUMNS,
    ms,
    pretty_json,
    short_state,
    state_class,
)
from .metadata import PLUGIN, VIEWS
from .task_page import load_task
from .timeline import CATEGORY_COLOURS, colour, timeline_svg

STATIC = "tasktape"  # static files are served under the distribution's name


def is_event_log(datasette: Any, database: str | None) -> bool:
    return database is not None and datasette.plugin_config(PLUGIN, database=database) is not None


def task_path(datasette: Any, database: str, task_id: str) -> str:
    return f"{datasette.urls.database(database)}/-/task/{quote(task_id, safe='')}"


def state_pill(state: str | None) -> Markup:
    if not state:
        return Markup("")
    return Markup('<span class="tt-pill {}" title="{}">{}</span>').format(
        state_class(state), state, short_state(state)
    )


@hookimpl
def render_cell(
    row: Any, value: Any, column: str, table: str | None, database: str, datasette: Any
) -> Markup | None:
    """Task states coloured, task ids linked to their page, exchange ids in views linked to
    the exchange, nanosecond durations shown in ms, JSON indented."""
    if not is_event_log(datasette, database) or value is None:
        return None
    if column in STATE_COLUMNS and isinstance(value, str) and value.startswith("TASK_STATE_"):
        return state_pill(value)
    if column == "task_id" and isinstance(value, str):
        href = task_path(datasette, database, value)
        return Markup('<a class="tt-task" href="{}">{}</a>').format(href, value)
    if column == "exchange_id" and isinstance(value, int) and (table is None or table in VIEWS):
        href = datasette.urls.row(database, "exchanges", str(value))
        return Markup('<a href="{}">{}</a>').format(href, value)
    if column in NS_COLUMNS and isinstance(value, int):
        return Markup('<span class="tt-ms" title="{:,} ns">{}</span>').format(value, ms(value, 3))
    if column in JSON_COLUMNS:
        pretty = pretty_json(value)
        if pretty is not None:
            return Markup('<pre class="tt-json">{}</pre>').format(pretty)
    return None


@hookimpl
def extra_css_urls(database: str | None, datasette: Any) -> list[str]:
    """The inspector's stylesheet, on every page (its classes all start with ``tt-``)."""
    return [datasette.urls.static_plugins(STATIC, "inspector.css")]


@hookimpl
def register_routes() -> list[tuple[str, Any]]:
    """The per-task page: ``/<database>/-/task/<task id>``."""
    return [(r"^/(?P<database>[^/]+)/-/task/(?P<task_id>[^/]+)$", task_view)]


async def task_view(request: Request, datasette: Any) -> Response:
    """One task's whole run at a glance; 404 for a task the log does not know."""
    name = tilde_decode(request.url_vars["database"])
    task_id = unquote(request.url_vars["task_id"])
    try:
        db = datasette.get_database(name)
    except KeyError:
        raise NotFound(f"no database {name}") from None
    if not is_event_log(datasette, name):
        raise NotFound(f"{name} is not served as an event log")
    # The log is read (and the checker run) off the event loop: other pages stay live.
    page = await asyncio.to_thread(load_task, db.path, task_id)
    if page is None:
        raise NotFound(f"no task {task_id} in {name}")
    context = {
        "page": page,
        "database": name,
        "timeline": timeline_svg(page),
        "pill": state_pill,
        "colour": colour,
        "category_colours": CATEGORY_COLOURS,
    }
    return Response.html(await datasette.render_template("tasktape_task.html", context, request=request))
