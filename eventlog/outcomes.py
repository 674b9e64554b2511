"""How an exchange ended: the values of ``exchanges.outcome``, which a held stream's end
(``tasktape record --resume``) shares."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    COMPLETE = "complete"  # the response ended whole
    CLIENT_DISCONNECTED = "client_disconnected"  # the client went away before the end
    UPSTREAM_DISCONNECTED = "upstream_disconnected"  # the upstream broke off mid-response
    UPSTREAM_ERROR = "upstream_error"  # the upstream failed before answering
    REFUSED = "refused"  # the recorder answered itself and forwarded nothing (a wrong Host, say)
    PROXY_STOPPED = "proxy_stopped"  # the recorder stopped during the exchange
    LOG_CLOSED = "log_closed"  # the log was closed during the exchange
    KILLED = "killed"  # killed in mitmproxy, by an addon or by hand
