"""Configuration read from files and the environment, bounded before it is parsed and
typed when refused.

A process's environment and the files it names (``CCDDP_PROFILE``, a secret file) are set
by whoever starts it, which need not be the user. Python's parsers fail on hostile input
in ways no caller catches: ``tomllib`` recurses once per nested array or inline table
(``RecursionError`` a few hundred levels down), reads integers of any length (``int``
refuses more than 4300 digits with a ``ValueError``; a 400-digit one overflows ``float()``
later, far from the file), and a file that is not UTF-8 raises ``UnicodeDecodeError``.
Here the size is checked before anything is read past it, UTF-8 before decoding, nesting
with a scan before the parser runs, and every integer of the result is bounded: each
refusal is one :class:`~ccddp.errors.ConfigError` that names the file and the field.

Python 3.11 is required (``tomllib``): see ``pyproject.toml``.

Example::

    data = read_toml("calibrated.toml", what="CCDDP_PROFILE=calibrated.toml")
    # ConfigError: CCDDP_PROFILE=calibrated.toml: field 'host.cores' is 10**30, outside ...
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Mapping

from ccddp.errors import ConfigError

#: A profile or settings file larger than this is not one (ccddp's own are under 10 KiB).
MAX_FILE_BYTES = 1 << 20
#: Nesting deeper than this is refused before parsing (ccddp's own files nest 3 deep).
MAX_DEPTH = 16
#: ccddp's results files (``--json``, ``results.json``) are larger and nest deeper.
MAX_RESULTS_BYTES = 256 << 20
RESULTS_DEPTH = 64
#: Every integer read from a configuration file fits a signed 64-bit field.
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1

# What the nesting scan stops at: string and comment openers, brackets, and what separates
# a (dotted) key from its neighbours.
_TOKEN = re.compile(r'"""|\'\'\'|["\'#\[\]{}.=,\n]')


def read_bounded(path, *, what: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the file ``path``, or :class:`ConfigError` naming ``what`` if it cannot
    be read or holds more than ``max_bytes`` (no more than ``max_bytes + 1`` are read)."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise ConfigError(f"{what}: cannot read it ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{what} is larger than {max_bytes} bytes: not a ccddp configuration file")
    return data


def decode_utf8(data: bytes, *, what: str) -> str:
    """``data`` as UTF-8 text, or :class:`ConfigError` naming ``what`` and the first bad byte."""
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} is not UTF-8 text (byte {e.start} is 0x{data[e.start]:02x})") from None


# The rest of a string after its opening quote(s), up to and including its closing
# quote(s) (a one-line string also stops at the end of its line; an unterminated one at
# the end of the text). Each alternative starts with a different character, so a match
# is linear in its length.
_STRING_REST = {
    '"': re.compile(r'(?:[^"\\\n]|\\.)*(?:"|\n|$)?'),
    "'": re.compile(r"[^'\n]*(?:'|\n|$)?"),
    '"""': re.compile(r'(?:[^"\\]|\\.|"(?!""))*(?:"""|$)?', re.S),
    "'''": re.compile(r"(?:[^']|'(?!''))*(?:'''|$)?", re.S),
}


def toml_nesting(text: str, limit: int) -> int:
    """How deep the TOML ``text`` nests, or ``limit + 1`` as soon as it is deeper than
    ``limit``: arrays, inline tables and table headers (brackets), and the parts of one
    dotted key (``a.b.c = 1`` nests three tables; ``tomllib`` spends time and memory
    quadratic in a key's parts). Brackets and dots in strings and comments do not count.
    Linear in the text; on text that is not TOML it may overstate, never understate (a
    stray closing bracket does not lower the count below zero; a value's dots, at most
    one per number or time, count as if they were a key's)."""
    depth = deepest = dots = 0
    i, n = 0, len(text)
    while i < n:
        m = _TOKEN.search(text, i)
        if m is None:
            break
        tok, i = m.group(), m.end()
        if tok == ".":
            dots += 1
            if dots >= limit:
                return limit + 1
            continue
        if tok == "'''":
            i = _STRING_REST["'''"].match(text, i).end()
            continue          # a quoted part of a dotted key: the key goes on
        if tok == '"""':
            i = _STRING_REST['"""'].match(text, i).end()
            continue
        if tok == "'":
            i = _STRING_REST["'"].match(text, i).end()
            continue
        if tok == '"':
            i = _STRING_REST['"'].match(text, i).end()
            continue
        dots = 0              # anything else ends a key (or a value)
        if tok in "[{":
            depth += 1
            if depth > limit:
                return limit + 1
            deepest = max(deepest, depth)
        elif tok in "]}":
            depth = max(0, depth - 1)
        elif tok == "#":
            nl = text.find("\n", i)
            i = n if nl < 0 else nl + 1
    return deepest


def check_tree(value, *, what: str, max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`ConfigError` naming ``what`` and the field if ``value`` (parsed JSON or
    TOML) nests deeper than ``max_depth`` or holds an integer outside a signed 64-bit
    field. Iterative: a tree built without brackets (TOML's dotted keys) cannot exhaust
    the stack either."""
    stack: list[tuple[object, str, int]] = [(value, "", 0)]
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            if not INT_MIN <= v <= INT_MAX:
                digits = len(str(abs(v))) if abs(v).bit_length() < 14000 else "thousands of"
                raise ConfigError(f"{what}: field '{where or '.'}' is an integer of {digits} digits; "
                                  f"at most {INT_MAX} is accepted")
            continue
        if isinstance(v, (Mapping, list, tuple)):
            if depth >= max_depth:
                raise ConfigError(f"{what}: field '{where}' is nested deeper than {max_depth} levels")
            items = v.items() if isinstance(v, Mapping) else enumerate(v)
            for k, item in items:
                key = f"{where}[{k}]" if not isinstance(v, Mapping) else (f"{where}.{k}" if where else str(k))
                stack.append((item, key, depth + 1))


def parse_toml(data: bytes, *, what: str, max_bytes: int = MAX_FILE_BYTES, max_depth: int = MAX_DEPTH) -> dict:
    """The TOML document in ``data``, or :class:`ConfigError` naming ``what``: larger than
    ``max_bytes``, not UTF-8, nested deeper than ``max_depth``, not TOML, or holding an
    integer outside a signed 64-bit field. Nothing else escapes."""
    if len(data) > max_bytes:
        raise ConfigError(f"{what} is larger than {max_bytes} bytes: not a ccddp configuration file")
    text = decode_utf8(data, what=what)
    if toml_nesting(text, max_depth) > max_depth:
        raise ConfigError(f"{what} is nested deeper than {max_depth} levels")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what}: not valid TOML: {e}") from None
    except (ValueError, RecursionError) as e:
        # ValueError: an integer longer than Python converts (sys.get_int_max_str_digits);
        # RecursionError only if the scan above missed a way to nest (a second line).
        raise ConfigError(f"{what}: not valid TOML: {str(e)[:120]}") from None
    check_tree(doc, what=what, max_depth=max_depth)
    return doc


def read_toml(path, *, what: str, max_bytes: int = MAX_FILE_BYTES, max_depth: int = MAX_DEPTH) -> dict:
    """:func:`parse_toml` of the file ``path`` (read no further than ``max_bytes + 1``)."""
    return parse_toml(read_bounded(path, what=what, max_bytes=max_bytes), what=what, max_bytes=max_bytes,
                      max_depth=max_depth)


def json_nesting(text: str, limit: int) -> int:
    """How deep arrays and objects nest in the JSON ``text`` (brackets in strings do not
    count), or ``limit + 1`` as soon as it is deeper than ``limit``. Linear; on text that
    is not JSON it may overstate, never understate."""
    depth = deepest = 0
    i, n = 0, len(text)
    while i < n:
        m = _JSON_TOKEN.search(text, i)
        if m is None:
            break
        tok, i = m.group(), m.end()
        if tok == '"':
            i = _STRING_REST['"'].match(text, i).end()
        elif tok in "[{":
            depth += 1
            if depth > limit:
                return limit + 1
            deepest = max(deepest, depth)
        else:
            depth = max(0, depth - 1)
    return deepest


_JSON_TOKEN = re.compile(r'["\[\]{}]')


def read_json(path, *, what: str, max_bytes: int = MAX_FILE_BYTES, max_depth: int = MAX_DEPTH):
    """The JSON value in the file ``path``, or :class:`ConfigError` naming ``what``: missing
    or unreadable, larger than ``max_bytes``, not UTF-8, nested deeper than ``max_depth``
    (checked before parsing), not JSON, or holding an integer outside a signed 64-bit
    field. ``NaN`` and ``Infinity`` are accepted: Python's ``json.dumps`` writes them for
    non-finite floats, and ccddp's own results hold some."""
    text = decode_utf8(read_bounded(path, what=what, max_bytes=max_bytes), what=what)
    if json_nesting(text, max_depth) > max_depth:
        raise ConfigError(f"{what} is nested deeper than {max_depth} levels")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        # ValueError: not JSON, or an integer longer than int() converts.
        raise ConfigError(f"{what}: not valid JSON: {str(e)[:120]}") from None
    check_tree(value, what=what, max_depth=max_depth)
    return value


def check_int(value, *, field: str, low: int, high: int) -> int:
    """``value`` if it is an integer (not a bool) in ``[low, high]``, else
    :class:`ConfigError` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{field} must be an integer, got {_show(value)}")
    if not low <= value <= high:
        raise ConfigError(f"{field} must be between {low} and {high}, got {_show(value)}")
    return value


def check_number(value, *, field: str, low: float, high: float) -> float:
    """``value`` if it is a finite int or float (not a bool) in ``[low, high]``, else
    :class:`ConfigError` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{field} must be a number, got {_show(value)}")
    if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
        raise ConfigError(f"{field} must be between {low} and {high}, got {_show(value)}")
    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(f"{field} must be between {low} and {high}, got {_show(value)}")
    return value


def _show(value) -> str:
    """``value`` for an error message: short, whatever it is (an integer of a million
    digits is not printed: ``repr`` of it raises)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 256:
        return f"an integer of about {int(abs(value).bit_length() * 0.30103)} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
