"""Reduction operators of the secure collectives: what a ring step does with a segment it
opened, and which dtypes each operator is defined for.

``SUM`` adds, ``PRODUCT`` multiplies, ``MIN``/``MAX`` keep the smaller/larger element, and
``BAND``/``BOR``/``BXOR`` combine bits (integer and bool tensors only); ``AVG`` is ``SUM``
followed by a division by the group size (floating-point tensors only, as in NCCL). Every
rank reduces the same operands in the same ring order, so all ranks end with identical
bytes, and the result equals torch.distributed's up to summation order.

Example::

    red = Reduction.from_name("max")
    red.check(torch.float32, "all_reduce")     # raises ConfigError for an undefined pair
    red.combine(region, incoming)              # region = max(region, incoming), in place
"""

from __future__ import annotations

import enum

import torch

from ccddp.errors import ConfigError


class Reduction(enum.IntEnum):
    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7

    @classmethod
    def from_name(cls, name: "str | Reduction") -> "Reduction":
        if isinstance(name, Reduction):
            return name
        try:
            return cls[str(name).upper()]
        except KeyError:
            raise ConfigError(f"unknown reduction {name!r}; choose from "
                              f"{', '.join(r.name.lower() for r in cls)}") from None

    @property
    def bitwise(self) -> bool:
        return self in (Reduction.BAND, Reduction.BOR, Reduction.BXOR)

    def check(self, dtype: torch.dtype, what: str) -> None:
        """Raise :class:`ConfigError` if this reduction is not defined on ``dtype``."""
        name = str(dtype).removeprefix("torch.")
        if self.bitwise and (dtype.is_floating_point or dtype.is_complex):
            raise ConfigError(f"{what}: {self.name} needs integer or bool tensors, got {name}")
        if self == Reduction.AVG and not (dtype.is_floating_point or dtype.is_complex):
            raise ConfigError(f"{what}: AVG needs floating-point tensors, got {name} "
                              "(use SUM and divide)")
        if self in (Reduction.MIN, Reduction.MAX) and dtype.is_complex:
            raise ConfigError(f"{what}: {self.name} is not defined for complex tensors ({name})")

    def combine(self, region: torch.Tensor, incoming: torch.Tensor, out: torch.Tensor | None = None) -> None:
        """``region = region (op) incoming``, in place; ``incoming`` has region's shape and dtype.
        With ``out`` (that shape and dtype too): ``out = region (op) incoming``, ``region``
        unchanged -- the same bits as copying ``region`` into ``out`` and combining there,
        in one pass (a prepared reduce-scatter's output)."""
        dest = region if out is None else out
        if self in (Reduction.SUM, Reduction.AVG):
            if region.dtype == torch.bool:
                torch.logical_or(region, incoming, out=dest)
            else:
                torch.add(region, incoming, out=dest)
        elif self == Reduction.PRODUCT:
            if region.dtype == torch.bool:
                torch.logical_and(region, incoming, out=dest)
            else:
                torch.mul(region, incoming, out=dest)
        elif self in (Reduction.MIN, Reduction.MAX):
            pick = torch.minimum if self == Reduction.MIN else torch.maximum
            if region.dtype.is_floating_point:
                # torch returns either operand for equal zeros, so two ranks combining in
                # opposite orders (the two-rank exchange) would keep different signs: the
                # signs of IEEE 754-2019's max/min instead (max(-0, +0) = +0, min = -0), the
                # same bits whichever operand comes first.
                both_zero = (region == 0) & (incoming == 0)
                zero = region + incoming if self == Reduction.MAX else -((-region) + (-incoming))
                pick(region, incoming, out=dest)
                torch.where(both_zero, zero, dest, out=dest)
            else:
                pick(region, incoming, out=dest)
        elif self == Reduction.BAND:
            torch.bitwise_and(region, incoming, out=dest)
        elif self == Reduction.BOR:
            torch.bitwise_or(region, incoming, out=dest)
        else:
            torch.bitwise_xor(region, incoming, out=dest)

    def finish(self, tensor: torch.Tensor, world_size: int) -> None:
        """What follows the ring: AVG divides the sum by the group size."""
        if self == Reduction.AVG:
            tensor.div_(world_size)
