"""DDP integration: secure comm hook, SecureDDP wrapper, secure process group for DDP's
own collectives, bounce path."""

from ccddp.ddp.bounce import BouncePath
from ccddp.ddp.hooks import HookState, plain_allreduce_hook, secure_allreduce_hook
from ccddp.ddp.process_group import SecureProcessGroup
from ccddp.ddp.worker import CommWorker
from ccddp.ddp.wrapper import SecureDDP

__all__ = ["BouncePath", "CommWorker", "HookState", "SecureDDP", "SecureProcessGroup", "plain_allreduce_hook",
           "secure_allreduce_hook"]
