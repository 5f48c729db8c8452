"""Medians with 95 % intervals, and paired ratios: how a report says what was measured
without claiming more than the measurement holds.

A ratio between two variants measured in turns (``ccddp train --cc off,on``,
``ccddp characterize``) is computed from the **per-round ratios** -- each round ran every
variant once (or a block of iterations each), seconds apart, so the machine's drift
cancels in the round's ratio. Its estimate is the **Hodges-Lehmann median** of those
ratios (on the log scale: the median of all pairwise geometric means, Walsh averages),
with the **95 % interval of the Wilcoxon signed-rank test** inverted (exact null
distribution). It assumes the rounds are independent and their log-ratios symmetric
about their centre; it is as robust to an outlying round as a median, and much narrower
than the order-statistic interval of a plain median (which with 10 rounds spans the 2nd
to the 9th ratio and covers 98 %, not 95 %). Fewer than 6 rounds cannot give a 95 %
interval this way; such a ratio has no interval and says so. Single times (medians of
iterations) keep the distribution-free order-statistic interval.

A ratio whose interval contains 1 is "no measurable difference", never a speed-up or a
slowdown.

Example::

    r = paired_ratio({0: 110.0, 1: 121.0, ...}, {0: 100.0, 1: 104.0, ...})
    r.estimate, r.low, r.high      # Hodges-Lehmann median of 110/100, 121/104, ... and its 95 % interval
    ratio_text(r)                  # '1.12× (1.05–1.18)' or 'no measurable difference (0.97–1.06)'
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
#: How every paired ratio in ccddp's reports is computed (quoted under tables).
METHOD = ("Hodges-Lehmann median of per-round ratios (the variants took turns within each round); "
          "95 % interval: Wilcoxon signed-rank, exact")
#: The fewest samples that give a 95 % interval (order statistics for a median; the
#: signed-rank test for a paired ratio: 6 is the first n whose exact two-sided p can
#: fall below 5 %).
MIN_SAMPLES = 6


@dataclass(frozen=True)
class Interval:
    """A median (``estimate``) of ``n`` samples with its 95 % interval [``low``, ``high``];
    ``low``/``high`` are None when ``n`` is too small for one."""

    estimate: float
    low: float | None
    high: float | None
    n: int

    @property
    def known(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def half_width(self) -> float | None:
        """Half the interval's width relative to the estimate (0.05 = ±5 %)."""
        if not self.known or self.estimate == 0:
            return None
        return (self.high - self.low) / 2 / abs(self.estimate)


class Verdict(enum.Enum):
    """What a CC-on/CC-off (or any A/B) ratio interval says."""

    SLOWER = "slower"                                   # the whole interval above 1
    FASTER = "faster"                                   # the whole interval below 1
    NO_DIFFERENCE = "no measurable difference"          # the interval contains 1
    UNKNOWN = "too few rounds for an interval"          # no interval


def median_interval(values: Sequence[float]) -> Interval | None:
    """The median of ``values`` and its distribution-free 95 % interval, or None if empty."""
    xs = sorted(float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v))
    if not xs:
        return None
    est = statistics.median(xs)
    if len(xs) < MIN_SAMPLES:
        return Interval(est, None, None, len(xs))
    from scipy.stats import quantile_test

    ci = quantile_test(xs, q=est, p=0.5).confidence_interval(CONFIDENCE)
    low, high = float(ci.low), float(ci.high)
    if not (math.isfinite(low) and math.isfinite(high)):
        return Interval(est, None, None, len(xs))
    return Interval(est, low, high, len(xs))


def signed_rank_null(n: int, upto: int | None = None):
    """Exact null distribution of the Wilcoxon signed-rank statistic for ``n`` samples:
    ``pmf[t]`` = the share of the 2**n sign patterns whose positive ranks sum to ``t``, for
    ``t`` up to ``upto`` (default: all, ``n(n+1)/2``) -- a lower tail is exact on its own,
    each ``pmf[t]`` depending only on smaller sums. (SciPy computes it only inside its test,
    so the subset-sum recursion is written here; halving at every rank keeps it finite for
    any n.)"""
    import numpy as np

    top = n * (n + 1) // 2 if upto is None else min(upto, n * (n + 1) // 2)
    pmf = np.zeros(top + 1)
    pmf[0] = 1.0
    for r in range(1, n + 1):          # rank r joins the positive sum or not, each half the time
        if r <= top:
            pmf[r:] += pmf[:-r]        # NumPy reads the overlapping operand as it was before
        pmf *= 0.5
    return pmf


def hodges_lehmann_interval(values: Sequence[float]) -> Interval | None:
    """Hodges-Lehmann estimate of the centre of ``values`` and the 95 % interval of the
    Wilcoxon signed-rank test (the Walsh averages between the critical order statistics);
    None if empty."""
    import numpy as np

    xs = np.sort(np.asarray([float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]))
    n = len(xs)
    if n == 0:
        return None
    i, j = np.triu_indices(n)
    walsh = np.sort((xs[i] + xs[j]) / 2)
    est = float(np.median(walsh))
    if n < MIN_SAMPLES:
        return Interval(est, None, None, n)
    # The 2.5 % quantile is below the median n(n+1)/4: the lower half of the null is enough
    # (a quarter of the work; ``ccddp report`` pools thousands of rounds).
    cdf = np.cumsum(signed_rank_null(n, upto=n * (n + 1) // 4))
    # k = the largest count with P(T < k) <= alpha/2: the interval is [W_(k), W_(N-k+1)]
    # (1-based), whose coverage is at least 95 %.
    k = int(np.searchsorted(cdf, (1 - CONFIDENCE) / 2, side="right"))
    if k == 0:
        return Interval(est, None, None, n)
    return Interval(est, float(walsh[k - 1]), float(walsh[len(walsh) - k]), n)


def paired_ratio(numerator: Mapping, denominator: Mapping) -> Interval | None:
    """Hodges-Lehmann median and signed-rank 95 % interval of ``numerator[k] /
    denominator[k]`` over the keys (rounds) both have, computed on the log scale (so
    A/B and B/A are reciprocal); None when they share none."""
    logs = [math.log(numerator[k] / denominator[k]) for k in numerator
            if k in denominator and denominator[k] and denominator[k] > 0 and numerator[k] and numerator[k] > 0]
    iv = hodges_lehmann_interval(logs)
    if iv is None:
        return None
    return Interval(math.exp(iv.estimate), None if iv.low is None else math.exp(iv.low),
                    None if iv.high is None else math.exp(iv.high), iv.n)


def verdict(ratio: Interval | None) -> Verdict:
    if ratio is None or not ratio.known:
        return Verdict.UNKNOWN
    if ratio.low > 1.0:
        return Verdict.SLOWER
    if ratio.high < 1.0:
        return Verdict.FASTER
    return Verdict.NO_DIFFERENCE


def interval_text(iv: Interval, digits: int = 2) -> str:
    """``(1.05–1.18)``; ``(n=3, no interval)``; ``(not measured in turns)`` for n = 0."""
    if not iv.known:
        return "(not measured in turns, no interval)" if iv.n == 0 else f"(n={iv.n}, no interval)"
    return f"({iv.low:.{digits}f}–{iv.high:.{digits}f})"


def shows_difference(ratio: Interval | None) -> bool:
    """Whether a ratio may be drawn or printed as a number: its interval excludes 1, or it
    has no interval and is not below 1 (a ratio below 1 is a speed-up claim, which only a
    whole interval below 1 supports)."""
    v = verdict(ratio)
    return v in (Verdict.SLOWER, Verdict.FASTER) or (v is Verdict.UNKNOWN and ratio is not None
                                                      and ratio.estimate >= 1.0)


def ratio_text(ratio: Interval | None, digits: int = 2) -> str:
    """A ratio as a reader should take it: ``1.12× (1.05–1.18)``; ``no measurable
    difference (0.97–1.06)`` when the interval contains 1 (or when, without an interval,
    it is below 1); the estimate with ``(n=3, no interval)`` otherwise."""
    if ratio is None:
        return "–"
    if not shows_difference(ratio):
        return f"no measurable difference {interval_text(ratio, digits)}"
    return f"{ratio.estimate:.{digits}f}× {interval_text(ratio, digits)}"


__all__ = ["CONFIDENCE", "METHOD", "MIN_SAMPLES", "Interval", "Verdict", "median_interval", "hodges_lehmann_interval",
           "signed_rank_null", "paired_ratio",
           "verdict", "interval_text", "ratio_text", "shows_difference"]
