"""DDP integration: secure comm hook, SecureDDP wrapper, secure state sync, bounce path."""

from ccddp.ddp.bounce import BouncePath
from ccddp.ddp.hooks import HookState, plain_allreduce_hook, secure_allreduce_hook
from ccddp.ddp.sync import module_states, secure_broadcast_tensors
from ccddp.ddp.worker import CommWorker
from ccddp.ddp.wrapper import SecureDDP

__all__ = ["BouncePath", "CommWorker", "HookState", "SecureDDP", "module_states", "plain_allreduce_hook",
           "secure_allreduce_hook", "secure_broadcast_tensors"]
