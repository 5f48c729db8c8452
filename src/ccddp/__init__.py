"""ccddp: confidential distributed data-parallel training for PyTorch.

Layers (imports point down only)::

    cli -> report -> bench | sim -> ddp -> workloads -> comm -> crypto

``sim`` models and never imports ``torch.distributed`` or ``comm``.
"""

__version__ = "0.1.0"
