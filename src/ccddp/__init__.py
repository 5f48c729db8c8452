"""ccddp: confidential distributed data-parallel training for PyTorch.

Layers (imports point down only)::

    cli -> report -> bench | sim -> ddp -> workloads -> comm -> crypto

``sim`` models and never imports ``torch.distributed`` or ``comm``.
"""

import sys as _sys

__version__ = "0.1.0"

# "ccddp" becomes a torch.distributed backend name. Installed, torch registers it by itself
# at import (the ``torch.backends`` entry point); here it is registered when torch is
# already loaded, without importing torch otherwise (the CLI and the model stay light).
if "torch.distributed" in _sys.modules:
    from ccddp.backend.registration import register as _register

    _register()
