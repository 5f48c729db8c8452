"""The one root finder the model's fits use: ``scipy.optimize.brentq`` on a bracket.

Every quantity ccddp solves for (a profile constant that makes the model reproduce a
measurement or a published number, the compute time behind a measured phase) is a
monotone function of one unknown on a known range; Brent's method finds it to machine
precision in a few dozen model evaluations.

Example::

    root(lambda x: x * x - 2, 0, 2)                 # 1.41421356...
    root(lambda r: 10 / r - 4, 1e-3, 1e3, log=True)  # 2.5, solved in log space
"""

from __future__ import annotations

import math
from typing import Callable


def root(fn: Callable[[float], float], lo: float, hi: float, *, log: bool = False,
         xtol: float = 1e-12, rtol: float = 1e-10) -> float | None:
    """The ``x`` in ``[lo, hi]`` where ``fn(x) == 0``; None when ``fn`` has the same sign
    at both ends (no root in the bracket). ``log``: search ``log(x)`` (rates spanning
    decades; ``lo`` must be > 0)."""
    from scipy.optimize import brentq

    if log:
        g = lambda u: fn(math.exp(u))  # noqa: E731
        a, b = math.log(lo), math.log(hi)
    else:
        g, a, b = fn, lo, hi
    fa, fb = g(a), g(b)
    if fa == 0:
        return lo
    if fb == 0:
        return hi
    if (fa > 0) == (fb > 0):
        return None
    x = brentq(g, a, b, xtol=xtol, rtol=rtol)
    return math.exp(x) if log else x


__all__ = ["root"]
