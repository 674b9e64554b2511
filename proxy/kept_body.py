"""What the log keeps of a request body streamed through to the upstream: its first bytes,
up to a bound, handed to the log once."""

from __future__ import annotations

from tasktape.eventlog import LogProducer


class KeptBody:
    """The first ``cap`` bytes of a body as it passes (``keep``), whether there were more,
    and whether it came to its end (``whole``)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.truncated = False
        self.whole = False
        self._logged = False

    def keep(self, data: bytes) -> None:
        room = self.cap - len(self.kept)
        if len(data) > room:
            self.truncated = True
        self.kept += data[: max(room, 0)]

    def log_if_whole(self, writer: LogProducer, exchange_id: int) -> None:
        """As the response begins: the body goes to the log now if the upstream read it
        whole first (as LLM APIs do: the log then knows the protocol the request speaks
        before its answer's events come); else when the exchange ends (``log``)."""
        if self.whole:
            self.log(writer, exchange_id)

    def log(self, writer: LogProducer, exchange_id: int) -> None:
        """Hand what was kept to the log, once: truncated where more came than it keeps, or
        where the body never came to its end (the upstream answered without reading it
        all, or the client went away while sending it)."""
        if not self._logged:
            self._logged = True
            cut = self.truncated or not self.whole
            writer.late_request_body(exchange_id, bytes(self.kept), truncated=cut)
