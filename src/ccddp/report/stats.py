"""Medians with 95 % intervals, and paired ratios: how a report says what was measured
without claiming more than the measurement holds.

A ratio between two variants measured in turns (``ccddp train --cc off,on``,
``ccddp characterize``) is the **median of the per-round ratios** -- each round ran every
variant once (or a block of iterations each), seconds apart, so the machine's drift
cancels in the round's ratio -- with a **distribution-free 95 % interval for that median
from order statistics** (the binomial interval of ``scipy.stats.quantile_test``; it
assumes only that rounds are independent). Fewer than 6 rounds cannot give a 95 %
interval this way; such a ratio has no interval and says so.

A ratio whose interval contains 1 is "no measurable difference", never a speed-up or a
slowdown.

Example::

    r = paired_ratio({0: 110.0, 1: 121.0, ...}, {0: 100.0, 1: 104.0, ...})
    r.estimate, r.low, r.high      # median of 110/100, 121/104, ... and its 95 % interval
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
METHOD = ("median of per-round ratios (the variants took turns within each round); 95 % interval: "
          "distribution-free, from order statistics (binomial)")
#: The fewest samples whose order statistics give a 95 % interval for a median.
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


def paired_ratio(numerator: Mapping, denominator: Mapping) -> Interval | None:
    """Median and interval of ``numerator[k] / denominator[k]`` over the keys (rounds) both
    have; None when they share none."""
    ratios = [numerator[k] / denominator[k] for k in numerator
              if k in denominator and denominator[k] and denominator[k] > 0]
    return median_interval(ratios)


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


__all__ = ["CONFIDENCE", "METHOD", "MIN_SAMPLES", "Interval", "Verdict", "median_interval", "paired_ratio",
           "verdict", "interval_text", "ratio_text", "shows_difference"]
