"""The signals that stop tasktape's long-running commands, gracefully: what they hold is
flushed first."""

from __future__ import annotations

import signal


def stop_signals() -> tuple[signal.Signals, ...]:
    """Ctrl-C, SIGTERM (kill, timeout, systemd) and a closing terminal's SIGHUP, unless the
    command started with SIGHUP ignored (``nohup``), which it keeps ignoring."""
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        return (signal.SIGINT, signal.SIGTERM)
    return (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
