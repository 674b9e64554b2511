"""``tasktape mitm``: mitmdump with the tasktape addon loaded, from the command line."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import click

from tasktape import proxy
from tasktape.errors import LogError
from tasktape.eventlog.interpreter import child_python

from .option_checks import refused_log
from .record import EXIT_LOG_FAILED
from .redaction_options import redaction_options
from .stop_signals import stop_signals

# mitmdump from this Python environment, where the addon's imports (eventlog) resolve. An
# addon cannot set mitmdump's exit status: once mitmdump is done (and the addon has closed
# its log), rows it could not write set it, as they do for tasktape record.
_MITMDUMP = (
    "import sys; from mitmproxy.tools.main import mitmdump; from tasktape.eventlog import LogProducer; "
    "sys.argv[0] = 'mitmdump'; status = mitmdump(); "
    f"sys.exit(status or ({EXIT_LOG_FAILED} if LogProducer.lost_in_process else 0))"
)
INSTALL_HINT = "mitmproxy is not installed here: pip install 'tasktape[mitm]'"
_PR_SET_PDEATHSIG = 1  # prctl(2)


def addon_path() -> Path:
    """The addon script, for ``mitmdump -s``."""
    return Path(proxy.__file__).resolve().with_name("mitm_addon.py")


def mitmproxy_missing() -> bool:
    return importlib.util.find_spec("mitmproxy") is None


def _print_addon_path(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(addon_path())
        ctx.exit()


@click.command()
@click.option(
    "--db", default="captures.db", show_default=True, type=click.Path(dir_okay=False), help="The event log."
)
@click.option(
    "--addon-path",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_addon_path,
    help="Print the addon's path, for a mitmdump of your own (`mitmdump -s PATH`), and exit.",
)
@redaction_options()
@click.argument("mitmdump_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- MITMDUMP-ARGS...]")
def mitm(
    db: str,
    redact_header: tuple[str, ...],
    redact_query: tuple[str, ...],
    redact_json: tuple[str, ...],
    mitmdump_args: tuple[str, ...],
) -> None:
    """Run mitmdump with the tasktape addon: every flow it handles is recorded into the log.

    For clients that cannot be pointed at `tasktape record` (a fixed host, HTTPS): use
    mitmproxy as they already do. Event streams are streamed through and teed chunk by
    chunk; everything else is recorded whole; redaction and outcomes are those of
    `tasktape record`. Everything after `--` goes to mitmdump as it is, e.g.
    `tasktape mitm --db captures.db -- --mode reverse:http://127.0.0.1:7473 -p 7470`, or
    `-- -p 8080` for an explicit HTTP(S) proxy. The addon's own options
    (`--set tasktape_hosts=...`, `tasktape_paths`, ...) can be passed there too.

    Ctrl-C or SIGTERM is passed on to mitmdump, which flushes the log and stops (on Linux,
    so does a SIGKILL of tasktape mitm, as a SIGTERM from the system); the exit
    status is mitmdump's, or 3 if any row could not be written to the log; before mitmdump
    starts, 1 if the log is held by another writer, 2 on bad input (an option's value, a
    --db that is no event log, or in a folder that does not exist).
    """
    if mitmproxy_missing():
        raise click.ClickException(INSTALL_HINT)
    # The mitmdump process is tasktape's: its start-up heap can leave the collector's sight.
    sets = [f"tasktape_db={db}", "tasktape_freeze_heap=true"]
    sets += [f"tasktape_redact_headers={name}" for name in redact_header]
    sets += [f"tasktape_redact_query={name}" for name in redact_query]
    sets += [f"tasktape_redact_json={pointer}" for pointer in redact_json]
    _check_settings(sets, mitmdump_args)
    _check_log(Path(db))
    python, env = child_python()
    args = [*python, "-c", _MITMDUMP, "-s", str(addon_path())]
    for setting in sets:
        args += ["--set", setting]
    sys.exit(run_forwarding_signals([*args, *mitmdump_args], env))


def _check_settings(own: list[str], mitmdump_args: tuple[str, ...]) -> None:
    """The addon's options after ``--`` with those tasktape mitm sets itself, checked before
    mitmdump starts: one given twice (``tasktape_db``, which ``--db`` sets), unknown or
    malformed made mitmproxy leave the addon out, silently, and nothing was recorded; one
    out of range (``tasktape_max_log_size=0``) stopped mitmdump with a traceback."""
    from mitmproxy.exceptions import OptionsError  # noqa: PLC0415 (mitmproxy: the extra)

    from tasktape.proxy.mitm_addon import check_settings  # noqa: PLC0415

    given = [
        value
        for flag, value in zip(("", *mitmdump_args), mitmdump_args, strict=False)
        if flag == "--set" and value.startswith("tasktape_")
    ]
    given += [a.removeprefix("--set=") for a in mitmdump_args if a.startswith("--set=tasktape_")]
    try:
        check_settings([*own, *given])
    except OptionsError as exc:
        raise click.UsageError(
            f"{exc} (the addon's options after --; tasktape mitm sets tasktape_db from --db and "
            "tasktape_freeze_heap itself): mitmproxy would leave the addon out, or stop, and record nothing"
        ) from None


def _check_log(db: Path) -> None:
    """The log opened (made, or upgraded) and let go before mitmdump starts, refused as
    tasktape record refuses it: the addon's refusal came as mitmproxy's traceback, once
    mitmdump had begun listening."""
    from tasktape.eventlog.schema import open_db  # noqa: PLC0415 (sqlite-utils: only here)
    from tasktape.eventlog.writer_lock import release_writer_lock, take_writer_lock  # noqa: PLC0415

    try:
        fd = take_writer_lock(db)
        try:
            open_db(db).close()
        finally:
            release_writer_lock(fd)
    except LogError as exc:  # as record says it
        raise refused_log(exc) from None


def run_forwarding_signals(args: list[str], env: dict[str, str]) -> int:
    """Run a child to its end, passing the signals that stop tasktape on (a SIGHUP as a
    SIGTERM: mitmdump would die of it without closing its log); its exit status (128 + the
    signal's number when a signal ended it, as shells report it). Where the system allows
    it, the child is sent SIGTERM when this process dies however it dies (SIGKILL), rather
    than being left listening, with the log held."""
    # (preexec_fn: this process runs no threads by then, which could hold a lock in the child.)
    child = subprocess.Popen(args, env=env, preexec_fn=_stopped_with_parent())  # noqa: PLW1509

    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

    previous = {s: signal.signal(s, forward) for s in stop_signals()}
    try:
        status = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - status if status < 0 else status


def _stopped_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux send the child SIGTERM when its parent dies; None
    elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # found before the fork, not in the child
    parent = os.getpid()

    def stop_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # it died before prctl: no signal will come
            os.kill(os.getpid(), signal.SIGTERM)

    return stop_with_parent
