"""Content-Encoding decoding for the log: gzip (every member of it), deflate (with or
without the zlib wrapper), and br when brotli is installed; incremental, and bounded, so
that a few hundred KiB of compressed bytes on the wire cannot become gigabytes in the
writer and the log."""

from __future__ import annotations

import zlib
from typing import Any

MAX_DECODED = 64 * 1024 * 1024  # bytes decoded per exchange at most, by default


class Inflate:
    """Decodes one body's Content-Encoding, ``limit`` decoded bytes at most in all."""

    def __init__(self, wbits: int | None, limit: int, brotli: Any = None) -> None:
        self._wbits = wbits
        self._z = zlib.decompressobj(wbits) if wbits is not None else None
        self._brotli = brotli  # the module, when decoding br
        self._brotli_decoder = brotli.Decompressor() if brotli else None
        self._first = True
        self.limit = limit
        self.room = limit  # decoded bytes still allowed
        self.exceeded = False  # the body decodes to more than the limit: the rest is not decoded

    @classmethod
    def for_encoding(cls, encoding: str, limit: int = MAX_DECODED) -> Inflate | None:
        """A decoder for ``encoding``, or None for one tasktape cannot decode here."""
        name = encoding.strip().lower()
        if name in ("gzip", "x-gzip"):
            return cls(16 + zlib.MAX_WBITS, limit)
        if name == "deflate":
            return cls(zlib.MAX_WBITS, limit)
        if name == "br":
            try:
                import brotli  # noqa: PLC0415 - optional, as for aiohttp
            except ImportError:
                return None
            return cls(None, limit, brotli)
        return None

    def feed(self, data: bytes) -> bytes:
        """The decoded bytes ``data`` gives, up to the limit (then ``exceeded`` is set and
        nothing more is decoded); zlib.error on bytes that are not what the encoding says."""
        if self.exceeded:
            return b""
        if self._z is None:
            try:
                return self._spend(self._brotli_decoder.process(data))
            except self._brotli.error as exc:
                raise zlib.error(f"brotli: {exc}") from None
        try:
            out = self._inflate(data)
        except zlib.error:
            if not (self._first and self._wbits == zlib.MAX_WBITS):
                raise
            # "deflate" is often sent as raw deflate, without the zlib wrapper.
            self._wbits = -zlib.MAX_WBITS
            self._z = zlib.decompressobj(self._wbits)
            out = self._inflate(data)
        self._first = False
        while self._z.eof and self._z.unused_data and not self.exceeded:  # gzip: members in turn
            rest = self._z.unused_data
            self._z = zlib.decompressobj(self._wbits)
            out += self._inflate(rest)
        return out

    def flush(self) -> bytes:
        return self._spend(self._z.flush()) if self._z is not None and not self.exceeded else b""

    def _inflate(self, data: bytes) -> bytes:
        assert self._z is not None
        # One byte more than the room left: enough to tell a body that fits from one that
        # does not, without ever holding more than the bound.
        out = self._z.decompress(data, self.room + 1)
        if self._z.unconsumed_tail:
            self.exceeded = True
        return self._spend(out)

    def _spend(self, out: bytes) -> bytes:
        if len(out) > self.room:
            self.exceeded = True
            out = out[: self.room]
        self.room -= len(out)
        return out


def decode_body(body: bytes, encoding: str | None, limit: int = MAX_DECODED) -> tuple[bytes, str | None]:
    """A whole body decoded from ``encoding``: ``(decoded, None)``, or ``(body, why)``
    when it cannot be (an unknown encoding, bytes that do not decode, over ``limit``)."""
    if not encoding or encoding.strip().lower() == "identity":
        return body, None
    inflate = Inflate.for_encoding(encoding, limit)
    if inflate is None:
        return body, f"cannot decode Content-Encoding {encoding}"
    try:
        decoded = inflate.feed(body) + inflate.flush()
    except zlib.error as exc:
        return body, f"content decoding failed ({exc})"
    if inflate.exceeded:
        return body, too_large(encoding, limit)
    return decoded, None


def too_large(encoding: str, limit: int) -> str:
    return f"Content-Encoding {encoding}: the body decodes to more than {limit:,} bytes (--max-decoded)"
