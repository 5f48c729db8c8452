"""JSON parsed from bytes another process sent: bounded before parsing, typed when refused.

``json.loads`` on received bytes fails in more ways than ``ValueError``: arrays nested a
few thousand deep exhaust the interpreter's recursion limit (``RecursionError``) before
the parser notices that they never close, and a multi-megabyte message is parsed in full
before anyone looks at its size. It also accepts what is not JSON (``NaN``,
``Infinity``) and an object that names a key twice (it keeps the last, another parser
may keep the first). :func:`parse_json` refuses all of these, the size and nesting before
the parser runs, and raises one typed error for every refusal -- the caller's
(:class:`~ccddp.errors.ConfigError` unless it names another
:class:`~ccddp.errors.CCDDPError`), whose message says what was wrong in one line.

Example::

    parse_json(b'{"world size": 2}', what="rank 1's setup message", max_bytes=1 << 16)
    # -> {"world size": 2}
    parse_json(b"[" * 100000, what="rank 1's setup message", max_bytes=1 << 20)
    # ConfigError: rank 1's setup message is nested deeper than 32 levels
"""

from __future__ import annotations

import json
import math
import re

from ccddp.errors import CCDDPError, ConfigError, one_line

DEFAULT_MAX_DEPTH = 32

# A JSON string, so that brackets inside strings are not counted as nesting. Unrolled
# (no alternation inside the repetition): linear on any input.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


class _Refused(ValueError):
    """Raised by the parser's hooks; turned into the caller's typed error."""


def nesting_depth(data: bytes, limit: int) -> int:
    """How deep arrays and objects nest in the JSON text ``data`` (brackets inside strings
    do not count), or ``limit + 1`` as soon as it is deeper than ``limit``. An unterminated
    string is scanned as if it were not one: for text that is not JSON anyway, the depth
    may then be overstated, never understated."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for c in brackets:
        if c in b"[{":
            depth += 1
            if depth > limit:
                return limit + 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _refuse_constant(name: str):
    raise _Refused(f"holds {name}, which is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"holds the number {text[:20]}, which overflows a double")
    return value


def _unique(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _Refused(f"names the key {twice[:40]!r} twice in one object")
    return d


def parse_json(data: bytes, *, what: str, max_bytes: int, max_depth: int = DEFAULT_MAX_DEPTH,
               error: type[CCDDPError] = ConfigError, allow_nan: bool = False) -> object:
    """The JSON value in ``data`` (UTF-8), or ``error`` naming ``what`` if ``data`` is larger
    than ``max_bytes``, nested deeper than ``max_depth``, not UTF-8, not JSON, holds
    ``NaN``/``Infinity`` or an out-of-range number (unless ``allow_nan``: what Python's
    ``json.dumps`` writes for a non-finite float), or names a key twice in one object.

    Nothing else escapes: no ``RecursionError``, ``UnicodeDecodeError`` or ``ValueError``.
    """
    data = bytes(data)
    if len(data) > max_bytes:
        raise error(f"{what} is {len(data)} bytes; at most {max_bytes} are accepted")
    if nesting_depth(data, max_depth) > max_depth:
        raise error(f"{what} is nested deeper than {max_depth} levels")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} is not UTF-8 (byte {e.start})") from None
    hooks: dict = {"object_pairs_hook": _unique}
    if not allow_nan:
        hooks.update(parse_constant=_refuse_constant, parse_float=_finite)
    try:
        return json.loads(text, **hooks)
    except _Refused as e:
        raise error(f"{what} {e}") from None
    except (ValueError, RecursionError) as e:
        # RecursionError: the depth scan bounds nesting well below the interpreter's limit,
        # so this is only a second line of defence (a caller deep in its own stack).
        raise error(f"{what} is not JSON ({one_line(str(e))[:120]})") from None
