"""Secure collectives over torch.distributed point-to-point operations."""

from ccddp.comm.collectives import all_gather, all_reduce, broadcast, reduce_scatter
from ccddp.comm.group import SecureGroup
from ccddp.comm.settings import IMPLS, CommSettings

__all__ = ["all_gather", "all_reduce", "broadcast", "reduce_scatter", "SecureGroup", "CommSettings", "IMPLS"]
