"""A mitmproxy addon recording every flow into a tasktape event log, as ``tasktape record``
does: ``mitmdump -s "$(tasktape mitm --addon-path)" --set tasktape_db=captures.db [--mode ...]``.

Event streams (``text/event-stream``) are streamed through, not buffered as mitmproxy
would (unless ``tasktape_stream_events`` is off), and each chunk is handed to the log with
its offset on the way; other responses are recorded whole. The writer is a
``ProcessLogWriter``: decoding, classification, redaction and SQLite run in a child
process, never on mitmproxy's event loop.
"""

from __future__ import annotations

import asyncio
import fnmatch
import gc
import logging
import sys
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

from mitmproxy import ctx, exceptions, http, optmanager
from mitmproxy.addonmanager import Loader
from mitmproxy.proxy.mode_specs import ProxyMode, ReverseMode

from tasktape.errors import LogError, UsageError
from tasktape.eventlog import ProcessLogWriter
from tasktape.eventlog.console_text import shown
from tasktape.eventlog.content_coding import MAX_DECODED
from tasktape.eventlog.exchange_rows import MAX_BODY, ExchangeSummary
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.redact import REDACTED, Redactor, parse_pointer
from tasktape.proxy.mitm_flows import (
    BUFFERED_UNTIMED,
    STOPPED,
    STREAMED,
    InFlight,
    head_fields,
    record_failure,
    record_saved_flow,
    request_fields,
    unimportable,
    unkept_status,
    unsent,
)
from tasktape.proxy.mitm_options import WRITER_OPTIONS, WriterSettings

logger = logging.getLogger("tasktape")

# The options whose values together leave event streams unmodified by modify_body.
_STREAMING_OPTIONS = frozenset({"modify_body", "tasktape_stream_events"})
# A flow's metadata key: the addon (its token) recorded the flow, live; mitmproxy may call a
# hook for it after the flow's end, with the flow no longer live. (The token, not True:
# mitmdump -w may save the flow after that, and another mitmdump reads it, to record.)
RECORDED = "tasktape_recorded"
# How many of the last flows read from a file the addon remembers as recorded.
_REMEMBERED = 1024
# The least value of each bound (tasktape_max_log_size may also be None: no bound).
_LEAST = {"tasktape_max_body": 0, "tasktape_max_decoded": 0, "tasktape_max_log_size": 1}
# mitmproxy's options whose values are credentials: kept out of the capture's argv.
_CREDENTIAL_OPTIONS = frozenset({"proxyauth", "upstream_auth", "web_password"})
# Its options that set a request header (``[/filter]/name/value``, ``-H`` for short): the
# value they give a credential header is kept out.
_HEADER_OPTIONS = frozenset({"modify_headers", "set_headers"})
_HEADER_FLAG = "-H"


def argv_without_credentials(argv: Sequence[str], headers: Collection[str]) -> list[str]:
    """mitmdump's arguments with the values of its credential options redacted, however
    given: ``--set proxyauth=VALUE``, ``--set=proxyauth=VALUE``, ``--proxyauth VALUE``,
    ``--proxyauth=VALUE`` (``--upstream-auth`` the same); and the value a header option
    (``-H``, ``--modify-headers``, ``--set modify_headers=``) gives one of ``headers``
    (credential headers' names, in lower case)."""
    header_spec = partial(_header_spec, headers=headers)
    out: list[str] = []
    hide_next: Callable[[str], str] | None = None
    for arg in argv:
        if hide_next is not None:  # (the value of the option before it)
            out.append(hide_next(arg))
            hide_next = None
            continue
        flag, equals, value = arg.partition("=")
        option = flag[2:].replace("-", "_") if flag.startswith("--") else ""
        if option in _CREDENTIAL_OPTIONS:
            out.append(f"{flag}={REDACTED}" if equals else arg)
            hide_next = None if equals else _redacted
        elif option in _HEADER_OPTIONS or arg == _HEADER_FLAG:
            out.append(f"{flag}={header_spec(value)}" if equals else arg)
            hide_next = None if equals else header_spec
        elif arg.startswith(_HEADER_FLAG):  # (-H with its value attached)
            out.append(_HEADER_FLAG + header_spec(arg.removeprefix(_HEADER_FLAG)))
        else:
            out.append(_setting(arg, header_spec))
    return out


def _setting(arg: str, header_spec: Callable[[str], str]) -> str:
    """An argument that may be a setting (``NAME=VALUE`` after ``--set``, or
    ``--set=NAME=VALUE``), with what it gives a credential redacted."""
    setting = arg.removeprefix("--set=")
    name, equals, value = setting.partition("=")
    name = name.replace("-", "_")
    if not equals or name not in _CREDENTIAL_OPTIONS | _HEADER_OPTIONS:
        return arg
    hidden = REDACTED if name in _CREDENTIAL_OPTIONS else header_spec(value)
    return arg[: len(arg) - len(value)] + hidden


def _redacted(_: str) -> str:
    return REDACTED


def _header_spec(spec: str, headers: Collection[str]) -> str:
    """A ``[/filter]/name/value`` header spec (its first character the separator) with the
    value redacted when the header is one of ``headers``; redacted whole when it cannot be
    read as one."""
    separator = spec[:1]
    parts = spec[1:].split(separator, 2) if separator else []
    if len(parts) not in (2, 3):
        return REDACTED
    name = parts[-2]
    return separator + separator.join([*parts[:-1], REDACTED]) if name.lower() in headers else spec


def check_settings(settings: Sequence[str]) -> None:
    """The addon's options as ``--set NAME=VALUE`` gives them, checked as mitmproxy and the
    addon check them once the addon has loaded: an OptionsError for a repeated, unknown or
    malformed one, or a value out of range. (Found then, mitmproxy says nothing, and the
    addon records nothing; or it stops with a traceback.)"""
    options = optmanager.OptManager()

    class Declared:  # the Loader's add_option, onto these options
        def add_option(self, name: str, typespec: Any, default: Any, help: str, choices: Any = None) -> None:
            options.add_option(name, typespec, default, help, choices)

    TasktapeRecorder().load(Declared())  # type: ignore[arg-type]
    options.set(*settings)
    check_values(options)
    if options.tasktape_max_log_size is not None:
        # Here tasktape mitm opens the log before mitmdump starts; in mitmdump, the writer
        # process says it.
        _check_log_size(options.tasktape_max_log_size)


def check_values(options: optmanager.OptManager) -> None:
    """An OptionsError for a value the options' types let through that the log would
    refuse: a malformed JSON pointer, a bound below its least."""
    for pointer in options.tasktape_redact_json:
        try:
            parse_pointer(pointer)
        except ValueError as exc:
            raise exceptions.OptionsError(f"tasktape_redact_json: {exc}") from None
    for name, least in _LEAST.items():
        value = getattr(options, name)
        if value is not None and value < least:
            raise exceptions.OptionsError(f"{name}: must be {least} or more, not {value}")


class TasktapeRecorder:
    """Records each HTTP flow as an exchange: request, response head, chunks with their
    offsets (streamed for event streams), and how it ended."""

    def __init__(self) -> None:
        self.writer: ProcessLogWriter | None = None
        self._settings: WriterSettings | None = None  # the writer's, once it is made
        self.capture_id = 0  # 0 until the capture is begun
        self._running = False
        self.flows: dict[str, InFlight] = {}
        self._hosts: tuple[str, ...] = ()
        self._paths: tuple[str, ...] = ()
        self._read: dict[str, None] = {}  # the ids of the last flows read from a file, recorded
        self._token = uuid.uuid4().hex  # this addon's, in the flows it ended (RECORDED)

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "tasktape_db", str | None, None, "Record every flow into this tasktape event log (SQLite)."
        )
        loader.add_option(
            "tasktape_redact_headers",
            Sequence[str],
            [],
            "Also redact this header in the log. Authorization, Proxy-Authorization, Cookie, "
            "Set-Cookie, X-Api-Key, Api-Key, X-Goog-Api-Key, X-Auth-Token and Private-Token always are.",
        )
        loader.add_option(
            "tasktape_redact_query",
            Sequence[str],
            [],
            "Also redact the value of this query parameter in the log. key, api_key, access_token, "
            "token, signature and the other usual credential parameters always are.",
        )
        loader.add_option(
            "tasktape_redact_json",
            Sequence[str],
            [],
            "Redact this JSON field in request bodies, response bodies and events in the log: a JSON "
            "pointer, '*' matching any key or index, '**' any depth, e.g. /params/message/metadata/apiKey "
            "or /**/apiKey.",
        )
        loader.add_option(
            "tasktape_hosts",
            Sequence[str],
            [],
            "Record only requests to these hosts (glob patterns such as *.example.com; default: all).",
        )
        loader.add_option(
            "tasktape_paths",
            Sequence[str],
            [],
            "Record only requests whose path matches one of these glob patterns, query excluded "
            "(such as /message:* or /v1/*; default: all).",
        )
        loader.add_option(
            "tasktape_max_body",
            int,
            MAX_BODY,
            "Keep at most this many bytes of a request body or of a response that is not an event stream.",
        )
        loader.add_option(
            "tasktape_max_decoded",
            int,
            MAX_DECODED,
            "Decode at most this many bytes of a flow's compressed (Content-Encoding) bodies for the "
            "log; what is past it is kept as it came, and the exchange says so.",
        )
        loader.add_option(
            "tasktape_max_log_size",
            int | None,
            None,
            "Stop writing the log at this size in bytes, at least what an empty log takes (about "
            "540 KB); traffic keeps flowing, lost rows are reported.",
        )
        loader.add_option(
            "tasktape_stream_events",
            bool,
            True,
            "Stream event streams (text/event-stream) through, each chunk teed into the log with its "
            "offset. Off, mitmproxy buffers them as it does other bodies, so that modify_body and "
            "addons' response hooks can change them, and each is recorded whole, without per-event timing.",
        )
        loader.add_option(
            "tasktape_freeze_heap",
            bool,
            False,
            "Once mitmproxy runs, move what start-up allocated out of the garbage collector's sight, "
            "so that collections traverse only what flows allocate. It concerns the whole process, "
            "other addons included: tasktape mitm, which runs the process, sets it.",
        )

    def configure(self, updated: set[str]) -> None:
        options = ctx.options
        if "tasktape_hosts" in updated:
            self._hosts = tuple(p.lower() for p in options.tasktape_hosts)
        if "tasktape_paths" in updated:
            self._paths = tuple(options.tasktape_paths)
        if updated & _STREAMING_OPTIONS:
            _warn_if_streams_unmodified()
        if updated & WRITER_OPTIONS:
            self._configure_writer(WriterSettings.of(options))

    def _configure_writer(self, settings: WriterSettings) -> None:
        """A new writer for new settings, in place of the one in use. Checked first, so that
        a refused change leaves the log open; unchanged settings leave it be (mitmproxy,
        rolling back a change refused by this addon or another, calls configure again with
        the values in use: reopening then ended the exchanges in flight)."""
        check_values(ctx.options)
        if settings == self._settings:
            return
        if settings.db is None:
            self._close()
            self._settings = settings
            logger.warning("tasktape: tasktape_db is not set, so nothing is recorded")
            return
        if self.writer is not None and settings.max_log_size is not None:
            _check_log_size(settings.max_log_size)
        if self.writer is not None and Path(settings.db).resolve() == self.writer.path.resolve():
            self._close()  # one writer at a time holds a log
            writer = _new_writer(settings)
        else:  # another log: the old one is kept if the new cannot be opened
            writer = _new_writer(settings)
            self._close()
        self.writer, self._settings = writer, settings
        if self._running:
            self._capture(writer)

    def _capture(self, writer: ProcessLogWriter) -> int:
        """The capture's id, begun on first need: once mitmproxy runs, or at a flow before
        that (one read from a file). When mitmproxy cannot listen it exits without the done
        hook, so a capture begun at start-up would never have ended."""
        if not self.capture_id:
            options = ctx.options
            modes = [ProxyMode.parse(m) for m in options.mode]
            upstream = modes[0].data if len(modes) == 1 and isinstance(modes[0], ReverseMode) else None
            argv = argv_without_credentials(sys.argv, Redactor(options.tasktape_redact_headers).headers)
            self.capture_id = writer.begin_capture(source="mitm", upstream=upstream, argv=argv)
            logger.info(f"tasktape: recording into {writer.path}")
        return self.capture_id

    def _close(
        self, outcome: str = Outcome.LOG_CLOSED, error: str = "the log was closed during the exchange"
    ) -> None:
        """End the exchanges in flight, then close the log (committing everything)."""
        writer, self.writer, self._settings = self.writer, None, None
        flows, self.flows = self.flows, {}
        capture_id, self.capture_id = self.capture_id, 0
        if writer is None:
            return
        for state in flows.values():
            if state.exchange:
                state.end(writer, outcome=outcome, error=error).add_done_callback(_say_undecoded)
            state.ended = True
        if capture_id:
            writer.end_capture(capture_id)
        writer.close()
        stats = writer.stats
        if stats.rows_lost:
            logger.error(
                f"tasktape: {stats.rows_lost} rows could not be written to {writer.path} "
                f"({stats.failed_batches} failed batches; last error: {stats.last_error})"
            )

    def running(self) -> None:
        self._running = True
        if self.writer is not None:
            self._capture(self.writer)
        if ctx.options.tasktape_freeze_heap:
            gc.freeze()

    def done(self) -> None:
        self._close(Outcome.PROXY_STOPPED, STOPPED)

    def _wanted(self, request: http.Request) -> bool:
        if self._hosts and not any(fnmatch.fnmatchcase(request.pretty_host.lower(), p) for p in self._hosts):
            return False
        path = request.path.partition("?")[0]
        return not self._paths or any(fnmatch.fnmatchcase(path, p) for p in self._paths)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        # A flow read from a file (mitmdump -r) is recorded once whole, as an import is.
        if self.writer is None or not flow.live or not self._wanted(flow.request):
            return
        state = self.flows[flow.id] = InFlight(time.perf_counter_ns())
        stream = flow.request.stream  # switched on by stream_large_bodies: keep what passes
        if stream:
            inner = stream if callable(stream) else None
            flow.request.stream = state.tee_request(inner, ctx.options.tasktape_max_body)

    def _begun(self, flow: http.HTTPFlow) -> InFlight | None:
        """The flow's state, its exchange begun (with the request as it stands)."""
        state = self.flows.get(flow.id)
        if state is not None and not state.exchange:
            assert self.writer is not None
            fields = request_fields(flow.request, ctx.options.tasktape_max_body)
            state.exchange = self.writer.begin_exchange(self._capture(self.writer), **fields)
        return state

    def request(self, flow: http.HTTPFlow) -> None:
        # A flow read from a file that was saved in flight with no answer yet gets no later
        # hook: recorded now.
        if self._begun(flow) is None and flow.response is None and flow.error is None:
            self._unfollowed(flow)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state = self._begun(flow)
        if state is None:
            return
        assert self.writer is not None and flow.response is not None
        head = head_fields(flow.response)
        if state.body is not None:
            state.body.log_if_whole(self.writer, state.exchange)
        if (unkept := unkept_status(flow.response)) is not None:
            state.notes.append(unkept)
            state.answer_unkept = True
            return
        state.held = (flow.response, {**head, "ttfb_ns": state.offset()})
        if flow.response.raw_content is not None:
            # Made in the request hook (by an addon, or server replay): mitmproxy sends it
            # whole, after the response hook, and never calls a stream callable, so it is
            # recorded whole, in the response hook.
            return
        # mitmproxy buffers a body whole unless it streams: live event streams are switched
        # to streaming (unless tasktape_stream_events is off); a body streamed anyway
        # (stream_large_bodies) is teed the same way. (A body of unknown size may still be
        # switched to streaming mid-way, with no hook: not kept then, and the exchange says
        # so as it ends.)
        stream = flow.response.stream
        if stream or (head["is_sse"] and ctx.options.tasktape_stream_events):
            state.send_head(self.writer)  # mitmproxy sends the head as it starts streaming
            flow.response.stream = state.tee_response(self.writer, stream if callable(stream) else None)
            flow.metadata[STREAMED] = True  # kept in a flow file (-w): its import knows it
        else:
            state.buffered_events = head["is_sse"]

    def response(self, flow: http.HTTPFlow) -> None:
        state = self.flows.get(flow.id)
        if state is None:
            self._unfollowed(flow)
            return
        assert flow.response is not None
        body = flow.response.raw_content  # as it stands now, as the addon records a flow
        # mitmproxy sends the response (a buffered body's head and body; a streamed one's
        # end) only once every addon's response hook has run, and sends nothing, calling no
        # error hook, if one of them killed the flow or its client left meanwhile. It runs
        # the hooks, then acts on them, in one task: what it did is known once that is done.
        hook = _running_task()
        if hook is None:  # (mitmproxy's test harness calls hooks outside a proxy)
            self._answered(flow, state, body)
        else:
            hook.add_done_callback(lambda _: self._answered(flow, state, body))

    def _answered(self, flow: http.HTTPFlow, state: InFlight, body: bytes | None) -> None:
        """End a flow's exchange as mitmproxy ended it after its response hook: the
        response (``body``, if buffered) sent, or not (the flow killed, its client gone).
        Nothing if the log was closed in between (it ended the exchange)."""
        if state.ended:
            return
        del self.flows[flow.id]
        assert self.writer is not None
        if flow.error is not None:
            self._end(flow, state, *unsent(flow))
            return
        state.send_head(self.writer)  # (a buffered body's)
        if state.response_tee is None and body and not state.answer_unkept:
            self.writer.chunk(state.exchange, state.offset(), body)
            if state.buffered_events:
                state.notes.append(BUFFERED_UNTIMED)
        self._end(flow, state)

    def error(self, flow: http.HTTPFlow) -> None:
        state = self._begun(flow)
        if state is None:
            self._unfollowed(flow)
            return
        del self.flows[flow.id]
        assert self.writer is not None
        outcome, error = record_failure(self.writer, state.exchange, flow, state.offset())
        self._end(flow, state, outcome, error)

    def _end(
        self, flow: http.HTTPFlow, state: InFlight, outcome: str = Outcome.COMPLETE, error: str | None = None
    ) -> None:
        assert self.writer is not None
        # (An option of mitmproxy's proxy server: absent from its test harness.)
        late_possible = bool(getattr(ctx.options, "stream_large_bodies", None))
        state.note_unrecorded(flow, late_possible)
        state.end(self.writer, outcome=outcome, error=error).add_done_callback(_say_undecoded)
        flow.metadata[RECORDED] = self._token

    def _unfollowed(self, flow: http.HTTPFlow) -> None:
        """A flow ending that the addon did not follow from its request headers: one read
        from a file is recorded now. (mitmproxy also ends some live flows with ``live``
        False: a killed one, in its error hook; one whose client left mid-body read to the
        upstream's close, in its response hook after its error's. Those it follows, it
        ended before, and marked so: see _saved.)"""
        if not flow.live:
            self._saved(flow)

    def _saved(self, flow: http.HTTPFlow) -> None:
        """A flow read from a file: recorded once, whole, with the times and the error it
        was saved with (its response hook comes before its error's, which it already has).
        Not one the addon followed live and ended (its mark)."""
        if self.writer is None or not self._wanted(flow.request):
            return
        if (why := unimportable(flow)) is not None:
            logger.warning(f"tasktape: flow {shown(str(flow.id))} read from a file is not recorded: {why}")
            return
        if flow.metadata.get(RECORDED) == self._token or flow.id in self._read:
            return
        self._remember(flow.id)
        capture = self._capture(self.writer)
        max_body = ctx.options.tasktape_max_body
        record_saved_flow(self.writer, capture, flow, max_body, ended=_say_undecoded)

    def _remember(self, flow_id: str) -> None:
        """Remember a flow read from a file as recorded. Only the last ones: its hooks come
        one after the other, and so do its copies in a file mitmdump -w saved it twice in
        (see read_flow_file); a long mitmdump -r is not held in memory."""
        self._read[flow_id] = None
        if len(self._read) > _REMEMBERED:
            del self._read[next(iter(self._read))]


def _running_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop runs
        return None


def _say_undecoded(done: Future[ExchangeSummary]) -> None:
    """Said in mitmproxy's log, as tasktape record says it on stderr: the log holds bytes it
    could not decode (a compression bomb, a broken or unknown Content-Encoding), which
    search and replay matching cannot read. (Called on the writer's thread.)"""
    if done.cancelled() or done.exception() is not None:  # (rows not written are said as the log closes)
        return
    if (note := done.result().undecoded_note("tasktape_max_decoded")) is not None:
        logger.warning(shown(f"tasktape: {note}"))


def _warn_if_streams_unmodified() -> None:
    """Say so when modify_body is set while event streams are streamed through: mitmproxy
    modifies no streamed body (it says as much of stream_large_bodies, not of this)."""
    # (An option of mitmproxy's own addons: absent from its test harness.)
    if getattr(ctx.options, "modify_body", None) and ctx.options.tasktape_stream_events:
        logger.warning(
            "tasktape: modify_body is set, but event streams (text/event-stream) are streamed through "
            "and mitmproxy modifies no streamed body: they pass unmodified. "
            "--set tasktape_stream_events=false leaves them buffered, so they are modified "
            "(and recorded whole, without per-event timing)."
        )


def _check_log_size(max_bytes: int) -> None:
    """An OptionsError for a bound below what an empty log takes: the schema's to say,
    loaded only when asked (a writer process knows it without loading it here)."""
    from tasktape.eventlog.schema import check_log_size  # noqa: PLC0415

    try:
        check_log_size(max_bytes)
    except UsageError as exc:
        raise exceptions.OptionsError(f"tasktape_max_log_size: {exc}") from None


def _new_writer(settings: WriterSettings) -> ProcessLogWriter:
    assert settings.db is not None
    redactor = Redactor(
        headers=settings.redact_headers, json_pointers=settings.redact_json, query=settings.redact_query
    )
    try:
        return ProcessLogWriter(
            settings.db,
            redactor=redactor,
            max_body=settings.max_body,
            max_decoded=settings.max_decoded,
            max_bytes=settings.max_log_size,
        )
    except LogError as exc:
        raise exceptions.OptionsError(f"tasktape_db: {exc}") from None
    except UsageError as exc:  # below what an empty log takes, which the writer knows
        raise exceptions.OptionsError(f"tasktape_max_log_size: {exc}") from None


addons = [TasktapeRecorder()]
