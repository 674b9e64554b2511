"""The mitmproxy addon's options that make its log writer. (A module of its own: mitmproxy
loads the addon script outside ``sys.modules``, where a dataclass cannot be defined.)"""

from __future__ import annotations

from dataclasses import dataclass, fields

from mitmproxy import optmanager


@dataclass(frozen=True)
class WriterSettings:
    """What the log writer is made with: the options ``tasktape_<field>``, a change to any
    of which takes a new writer."""

    db: str | None
    redact_headers: tuple[str, ...]
    redact_query: tuple[str, ...]
    redact_json: tuple[str, ...]
    max_body: int
    max_decoded: int
    max_log_size: int | None

    @classmethod
    def of(cls, options: optmanager.OptManager) -> WriterSettings:
        return cls(
            db=options.tasktape_db or None,  # (an empty value, as unset: no log)
            redact_headers=tuple(options.tasktape_redact_headers),
            redact_query=tuple(options.tasktape_redact_query),
            redact_json=tuple(options.tasktape_redact_json),
            max_body=options.tasktape_max_body,
            max_decoded=options.tasktape_max_decoded,
            max_log_size=options.tasktape_max_log_size,
        )


WRITER_OPTIONS = frozenset(f"tasktape_{f.name}" for f in fields(WriterSettings))
