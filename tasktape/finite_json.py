"""JSON as a command's --json prints it: valid JSON, whatever numbers the recordings held."""

from __future__ import annotations

import json
import math
from typing import Any


def finite_json(doc: Any) -> str:
    """``doc`` as indented JSON text. A number past a float's range in a recording
    (``1e999``, read as infinity) or a NaN is its name as a string ("Infinity",
    "-Infinity", "NaN"): as a bare word it is no JSON, and a strict parser (jq,
    JSON.parse) refuses the whole output."""
    return json.dumps(_finite(doc), indent=2, ensure_ascii=False, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)  # (as Python's json module spells them)
    if isinstance(value, dict):
        return {key: _finite(v) for key, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
