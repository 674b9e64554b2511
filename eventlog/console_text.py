"""Text from the traffic, a recording or a cassette, as a console line shows it."""

from __future__ import annotations

import re

# Control characters (C0, DEL, C1): from the traffic, they would move the cursor, clear the
# terminal, set its title or start a line of their own. A tab is left as it is: it moves
# the cursor along its line only, and code in an answer (a Makefile) is indented by it.
# Lone surrogates (a header's bytes that are not UTF-8, as Python reads them; a JSON
# string's \udcXX): printed, they are not UTF-8 either, which a terminal shows as mojibake
# and grep takes for a binary file.
_UNSHOWN = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff]")


def shown(text: str) -> str:
    """Text from the traffic as a console line shows it: control characters but a tab
    escaped (``\\x1b``), lone surrogates as their code point (``\\udce9``, where the byte 0xe9
    that is not UTF-8 came in), printable Unicode as it is."""
    return _UNSHOWN.sub(_escaped, text)


def _escaped(m: re.Match[str]) -> str:
    code = ord(m[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
