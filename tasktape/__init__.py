"""tasktape: record, replay and inspect streaming agent traffic.

The front door: the ``tasktape`` command line. The building blocks live in
``eventlog`` (the record), ``proxy``, ``replay`` and ``inspector``.
"""

from eventlog import __version__

__all__ = ["__version__"]
