"""How an expected value in a scenario matches what a driver reported.

Owns the small matching language of scenario files:

- a plain value matches an equal value; a token (a decimal string) is
  compared as an exact integer, never as a float;
- ``{"gt": X}``, ``{"ge": X}``, ``{"lt": X}``, ``{"le": X}``, ``{"eq": X}``,
  ``{"ne": X}``: integer comparisons (X a number, a decimal string or a
  reference), several in one object all apply;
- ``{"any": true}``: anything, present or not; ``{"absent": true}``: not there;
- ``{"one_of": [...]}``: equal to one of them;
- a dict of fields: each field named matches (fields not named are free);
- a string ``"$name.field"``: the value a scenario saved under ``name``
  (an answer's ``ok`` object, or a number the runner recorded).

Never does: I/O. ``mismatch`` returns why a value does not match, or None.
"""

from __future__ import annotations

from typing import Any, Callable

OPS = {"gt", "ge", "lt", "le", "eq", "ne"}


def resolve(value: Any, lookup: Callable[[str], Any]) -> Any:
    """Replace every ``$name.field`` string, at any depth, by what it names."""
    if isinstance(value, str) and value.startswith("$"):
        return lookup(value[1:])
    if isinstance(value, list):
        return [resolve(v, lookup) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, lookup) for k, v in value.items()}
    return value


def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def mismatch(expected: Any, actual: Any, path: str = "") -> str | None:
    where = path or "the value"
    if isinstance(expected, dict) and expected.keys() & (OPS | {"any", "absent", "one_of"}):
        if expected.get("any"):
            return None
        if expected.get("absent"):
            return None if actual is _MISSING else f"{where}: expected nothing, got {actual!r}"
        if actual is _MISSING:
            return f"{where}: missing"
        if "one_of" in expected:
            if not any(mismatch(e, actual, path) is None for e in expected["one_of"]):
                return f"{where}: {actual!r} is none of {expected['one_of']!r}"
        for op in OPS & expected.keys():
            a, e = as_int(actual), as_int(expected[op])
            if a is None or e is None:
                return f"{where}: {op} needs integers, got {actual!r} and {expected[op]!r}"
            ok = {"gt": a > e, "ge": a >= e, "lt": a < e, "le": a <= e, "eq": a == e, "ne": a != e}[op]
            if not ok:
                return f"{where}: expected {op} {e}, got {a}"
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{where}: expected an object, got {actual!r}"
        for k, e in expected.items():
            why = mismatch(e, actual.get(k, _MISSING), f"{path}.{k}" if path else k)
            if why:
                return why
        return None
    if actual is _MISSING:
        return f"{where}: missing (expected {expected!r})"
    if isinstance(expected, str) and isinstance(actual, str):
        return None if expected == actual else f"{where}: expected {expected!r}, got {actual!r}"
    ei, ai = as_int(expected), as_int(actual)
    if ei is not None and ai is not None:
        return None if ei == ai else f"{where}: expected {ei}, got {ai}"
    return None if expected == actual else f"{where}: expected {expected!r}, got {actual!r}"


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()
