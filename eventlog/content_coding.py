"""Content-Encoding decoding for the log: gzip (every member of it), deflate (with or
without the zlib wrapper), and br when brotli is installed; incremental, and bounded, so
that a few hundred KiB of compressed bytes on the wire cannot become gigabytes in the
writer and the log."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

MAX_DECODED = 64 * 1024 * 1024  # bytes decoded per exchange at most, by default
STEP = 1024 * 1024  # bytes decoded at a time
# brotli (1.1, which mitmproxy pins) has no bound on what one call decodes: 5 KiB can be
# a GiB. It is given this many compressed bytes at a time, which decode to 40 MiB at most
# (a meta-block, up to 16 MiB, takes a few bytes); once a call decoded more than STEP,
# fewer: 16 MiB at most. (Smaller slices cost more calls on ordinary bodies.)
BROTLI_SLICE = 64
BROTLI_SLICE_SMALL = 16


class Inflate:
    """Decodes one body's Content-Encoding, ``limit`` decoded bytes at most in all."""

    def __init__(self, wbits: int | None, limit: int, brotli: Any = None) -> None:
        self._wbits = wbits
        self._z = zlib.decompressobj(wbits) if wbits is not None else None
        self._brotli = brotli  # the module, when decoding br
        self._brotli_decoder = brotli.Decompressor() if brotli else None
        # "deflate" is often sent as raw deflate, without the zlib wrapper: until its two
        # bytes of header are read (they may come a byte at a time), the bytes taken, to
        # decode again as raw deflate if they turn out not to be one.
        self._unsure: bytes | None = b"" if wbits == zlib.MAX_WBITS else None
        self._slice = BROTLI_SLICE  # compressed bytes brotli is given at a time
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
        return b"".join(self.pieces(data))

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """Like :meth:`feed`, in pieces of at most STEP bytes: the caller never holds what a
        whole chunk decodes to at once."""
        if self.exceeded:
            return
        if self._z is None:
            yield from self._brotli_pieces(memoryview(data))
            return
        while not self.exceeded:
            try:
                out = self._z.decompress(data, min(STEP, self.room + 1))
            except zlib.error:
                if self._unsure is None:
                    raise
                data, self._unsure = self._unsure + data, None
                self._wbits = -zlib.MAX_WBITS
                self._z = zlib.decompressobj(self._wbits)
                continue
            if self._unsure is not None:
                taken = self._unsure + data[: len(data) - len(self._z.unconsumed_tail)]
                self._unsure = None if out or len(taken) >= 2 else taken
            data = self._z.unconsumed_tail
            if self._z.eof and self._z.unused_data:  # gzip: members one after another
                data = self._z.unused_data
                self._z = zlib.decompressobj(self._wbits)
            if out:
                yield self._spend(out)
            if not data:
                return

    def _brotli_pieces(self, data: memoryview) -> Iterator[bytes]:
        while data and not self.exceeded:
            given, data = data[: self._slice], data[self._slice :]
            try:
                out = self._brotli_decoder.process(given.tobytes())
            except self._brotli.error as exc:
                raise zlib.error(f"brotli: {exc}") from None
            if len(out) > STEP:
                self._slice = BROTLI_SLICE_SMALL
            if out:
                yield self._spend(out)

    def flush(self) -> bytes:
        return self._spend(self._z.flush()) if self._z is not None and not self.exceeded else b""

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


class TooLarge(str):
    """Why a body is left as it came: it decodes to more than the bound. Its text is a
    reason like the others; a caller refusing such a body tells it from them by its type,
    and one whose bound is an option names the option where it says the reason."""


def too_large(encoding: str, limit: int) -> TooLarge:
    """The reason, naming no option: the bound is each caller's own (a recorder's
    ``--max-decoded``, mitmproxy's ``tasktape_max_decoded``, the control API's fixed one)."""
    return TooLarge(f"Content-Encoding {encoding}: the body decodes to more than {limit:,} bytes")


# What an exchange's error says when its body's decoding stopped part-way (too large, bytes
# that do not decode): the rest of the body is stored as it came, still encoded. (The log
# keeps the words: logs written before keep being read by them.)
REST_AS_RECEIVED = "the rest of the body is stored as received"


def rest_undecoded(error: str | None) -> str | None:
    """Why a body is stored decoded only in part, the rest as it came (an exchange's error
    says so, among its other errors); None for a body stored in one form."""
    said = (part for part in (error or "").split("; ") if part.endswith(f": {REST_AS_RECEIVED}"))
    return next((part.removesuffix(f": {REST_AS_RECEIVED}") for part in said), None)
