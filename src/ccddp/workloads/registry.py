"""Names of the paper's seven workloads and :func:`get_workload`.

Example::

    from ccddp.workloads import WORKLOADS, get_workload

    list(WORKLOADS)                       # ['graphsage', 'resnet50', ..., 'gpt2-xl']
    wl = get_workload("resnet50", batch_size=4, seed=1)
    wl.shapes["image_size"]               # 224
"""

from __future__ import annotations

from typing import Any

from ccddp.errors import ConfigError
from ccddp.workloads.base import Workload
from ccddp.workloads.graph import GraphSAGEWorkload
from ccddp.workloads.language import GPT2XL, BertBase, BertLarge, GPT2Large
from ccddp.workloads.vision import ResNet50, ResNet101

#: name -> Workload class, in the order of the paper's Table I (smallest model first).
WORKLOADS: dict[str, type[Workload]] = {
    "graphsage": GraphSAGEWorkload,
    "resnet50": ResNet50,
    "resnet101": ResNet101,
    "bert-base": BertBase,
    "bert-large": BertLarge,
    "gpt2-large": GPT2Large,
    "gpt2-xl": GPT2XL,
}


def check_name(name: str) -> str:
    """``name`` if it is a registered workload, else :class:`ConfigError`."""
    if name not in WORKLOADS:
        raise ConfigError(f"unknown workload '{name}'; choose one of: {', '.join(WORKLOADS)}")
    return name


def get_workload(name: str, size: str = "default", **overrides: Any) -> Workload:
    """The workload ``name`` at ``size`` (``"default"`` or ``"tiny"``).

    ``overrides`` replace preset settings: ``batch_size`` (per rank), ``seq_len``,
    ``image_size``, ``fanouts``, ``dtype`` (``"float32"``, ``"bfloat16"``,
    ``"float16"``), ``seed``, and the architecture's own keys (``wl.settings`` lists
    them). ``None`` values keep the preset, so CLI options can be passed straight
    through. Unknown names, sizes or settings raise :class:`ConfigError`.

    Example::

        wl = get_workload("gpt2-xl", dtype="float32")   # the paper's fp32, needs ~19 GB/rank
        wl.shapes["dtype_reduced"]                       # False
    """
    return WORKLOADS[check_name(name)](name, size, **overrides)
