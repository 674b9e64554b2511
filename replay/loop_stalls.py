"""Whether the event loop a tape is served in stopped running: a blocking call in an async
test (a synchronous client, most often) keeps the replay from answering that very call,
which then waits for its own timeout. A beat in the loop measures it, after the fact."""

from __future__ import annotations

import asyncio

BEAT = 0.1  # seconds between two beats
STALLED = 1.0  # a loop that did not run for this long is said to have stalled


class LoopStalls:
    """The longest time the loop did not run while the tape was served."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.longest = 0.0
        self._loop = loop
        self._last = loop.time()
        self._beat_handle = loop.call_later(BEAT, self._beat)

    def _beat(self) -> None:
        now = self._loop.time()
        self.longest = max(self.longest, now - self._last - BEAT)
        self._last = now
        self._beat_handle = self._loop.call_later(BEAT, self._beat)

    def stop(self) -> None:
        self._beat_handle.cancel()

    def note(self) -> str | None:
        """What to say beside a failure, if the loop stalled."""
        if self.longest < STALLED:
            return None
        return (
            f"the test's event loop, which serves the cassette, did not run for {self.longest:.1f} s: a "
            "blocking call in the async test (a synchronous HTTP client?) keeps the replay from answering "
            "it. Make the call in a thread (asyncio.to_thread), or serve the cassette in a thread of its "
            "own: @pytest.mark.tasktape(in_thread=True)"
        )
