"""How many crypto chains a rank runs when none are asked for: one rule, shared by the
secure collectives (``ccddp.comm.CommSettings``) and the performance model (``ccddp.sim``).

A chain is a crypto thread sealing or opening segments beside the others (on a GPU: one
serial GHASH chain of a multi-chain MAC). The ranks of one node share its cores, so each
rank takes its share: ``cores // local ranks``, at least one. This module imports nothing,
so the model can use the rule without torch.

Example::

    auto_chains(cores=16, local_ranks=4)    # 4
    auto_chains(cores=2, local_ranks=4)     # 1
"""

from __future__ import annotations


def auto_chains(cores: int, local_ranks: int) -> int:
    """Crypto chains per rank: the node's ``cores`` shared by its ``local_ranks``."""
    return max(1, int(cores) // max(1, int(local_ranks)))


__all__ = ["auto_chains"]
