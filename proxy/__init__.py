"""Writes the record: the aiohttp reverse proxy that tees traffic into the event log."""

from .recorder import RecordingProxy

__all__ = ["RecordingProxy"]
