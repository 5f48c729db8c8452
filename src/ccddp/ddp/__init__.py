"""DDP conveniences on top of the ``ccddp`` backend: the SecureDDP wrapper, timing marks
for comm hooks, the input bounce path."""

from ccddp.ddp.bounce import BouncePath
from ccddp.ddp.hooks import HookState, timed
from ccddp.ddp.wrapper import SecureDDP

__all__ = ["BouncePath", "HookState", "SecureDDP", "timed"]
