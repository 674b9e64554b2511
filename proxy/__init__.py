"""Writes the record: the aiohttp reverse proxy that tees traffic into the event log."""
