"""SQLite's process-wide settings, for a process whose work is writing a log.

SQLite keeps count of the memory it holds unless told not to, and keeping count takes a
mutex around every allocation. An event row's insert allocates about 35 times, so the
count is about 4% of what a log writer spends (4,200 of 92,000 instructions an event).
SQLite takes such settings only while it holds nothing in the process, so
``stop_counting_memory`` changes this one only then, in the library the ``sqlite3``
module itself calls, and says whether it did; anywhere else it changes nothing.
"""

from __future__ import annotations

import _sqlite3
import ctypes
import sqlite3

_CONFIG_MEMSTATUS = 9  # SQLITE_CONFIG_MEMSTATUS


def _library() -> ctypes.CDLL | None:
    """The SQLite the ``sqlite3`` module is linked with (or built from), where its
    functions can be called: looked up through the extension module itself."""
    try:
        lib = ctypes.CDLL(_sqlite3.__file__)
        lib.sqlite3_libversion.restype = ctypes.c_char_p
        lib.sqlite3_memory_used.restype = ctypes.c_int64
    except (AttributeError, OSError):  # a built-in module, or a library without those names
        return None
    if lib.sqlite3_libversion().decode() != sqlite3.sqlite_version:
        return None
    return lib


def stop_counting_memory() -> bool:
    """Have SQLite stop counting its memory in this process, if nothing of SQLite's is
    open here (no connection, no statement); True if it does not count (any more). Call it
    first thing in a process of one's own, before any connection opens: SQLite is shut
    down and started again around the change."""
    lib = _library()
    if lib is None or lib.sqlite3_memory_used() != 0:
        return False
    # Nothing counted: nothing open, or nothing counted at all (counting already off).
    probe = sqlite3.connect(":memory:")
    counting = lib.sqlite3_memory_used() > 0
    probe.close()
    if not counting:
        return True
    if lib.sqlite3_memory_used() != 0 or lib.sqlite3_shutdown() != 0:
        return False
    stopped = lib.sqlite3_config(_CONFIG_MEMSTATUS, ctypes.c_int(0)) == 0
    return lib.sqlite3_initialize() == 0 and stopped
