"""ccddp: confidential distributed data-parallel training for PyTorch.

Layers (imports point down only; ``tests/test_layers.py`` checks them)::

    cli
    report                  tables, figures and report.md, from results JSON only
    bench | sim             measured runs, the SecureDDP harness (with testing: the link
                            adversary) | the model
    workloads               the paper's seven models
    backend                 the "ccddp" torch.distributed backend: the product's API
    comm                    the engine: sealed collectives over links
    crypto                  keys, AEAD channel, engines
    errors chains stats runs config   leaves (config: files and environment, bounded)

``sim`` models and never imports ``torch.distributed`` or ``comm``; ``report`` imports
neither torch nor ``bench``. The product (crypto, comm, backend) needs only torch,
cryptography and numpy; the rest of the ``bench`` extra is for measuring and reporting.
"""

import sys as _sys

__version__ = "0.1.0"

# "ccddp" becomes a torch.distributed backend name. Installed, torch registers it by itself
# at import (the ``torch.backends`` entry point); here it is registered when torch is
# already loaded, without importing torch otherwise (the CLI and the model stay light).
if "torch.distributed" in _sys.modules:
    from ccddp.backend.registration import register as _register

    _register()
