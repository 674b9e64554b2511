"""Who may follow a held stream again: a resuming recorder answers a reconnect without
asking the agent, so it asks what the agent would have. A stream is followed only by a
request carrying the credentials the request that opened it carried (the headers the log
redacts: ``Authorization``, ``Cookie``, ``X-API-Key``... and any ``--redact-header``),
and only after an id that is not guessed: the recorder's ids carry a key of their stream
that only its clients were sent. A request read back from the log has its query's
credentials redacted (``?token=[REDACTED]``): they count as its credential headers do.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable

from multidict import CIMultiDictProxy

from tasktape.choices import listed
from tasktape.eventlog.protocols.base import Request
from tasktape.eventlog.redact import DEFAULT_HEADERS

from .reconnects import redacted_query

# What a stream keeps of its credentials is a digest under this run's key: they are in no
# memory longer than the request that carried them.
_RUN_KEY = secrets.token_bytes(16)
KEY_DIGITS = 12  # of a stream's key, in hex: 48 bits


class Credentials:
    """The credential headers compared (names, any case), and the digests of requests'."""

    def __init__(self, names: Iterable[str] = DEFAULT_HEADERS) -> None:
        self.names = tuple(sorted({n.lower() for n in listed(names, "credential_headers")}))

    def of(self, headers: CIMultiDictProxy[str]) -> bytes:
        """The digest of a request's credentials (b"": it carried none)."""
        found = [
            f"{name}:{_as_compared(name, value)}" for name in self.names for value in headers.getall(name, ())
        ]
        if not found:
            return b""
        return hashlib.blake2b("\n".join(found).encode(), key=_RUN_KEY, digest_size=16).digest()

    def carried(self, headers: Iterable[tuple[str, str]]) -> bool:
        """Whether a request (as the log holds it: credentials redacted) carried any."""
        return any(name.lower() in self.names for name, _ in headers)

    def carried_by(self, request: Request) -> bool:
        """Whether a request read back from the log carried any: in its headers, or in its
        query (a parameter the log redacted, ``?token=[REDACTED]``)."""
        return self.carried(request.headers) or redacted_query(request.path)


# Headers whose value starts with an auth scheme, which HTTP compares case-insensitively
# (RFC 9110 section 11.1): ``bearer`` is ``Bearer``. Their credentials are compared as sent.
_SCHEMED = frozenset({"authorization", "proxy-authorization"})


def _as_compared(name: str, value: str) -> str:
    if name not in _SCHEMED:
        return value
    scheme, space, rest = value.partition(" ")
    return scheme.lower() + space + rest


def same(kept: bytes, given: bytes) -> bool:
    """Whether a reconnect's credentials are the stream's (in constant time)."""
    return hmac.compare_digest(kept, given)


def stream_key(capture_uid: str, exchange_id: int) -> str:
    """The key of the stream an exchange opened, in the recorder's ids of its events: made
    from its capture's uid, so that the same stream rebuilt from the log after a restart
    has the same ids, and no id of one stream tells another's."""
    digest = hashlib.blake2b(str(exchange_id).encode(), key=capture_uid.encode(), digest_size=KEY_DIGITS // 2)
    return digest.hexdigest()
