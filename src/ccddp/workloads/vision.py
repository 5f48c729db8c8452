"""ResNet-50 and ResNet-101 on ImageNet-shaped data (paper Table I: CNN, batch 1024).

The architecture is ``transformers``' ``ResNetForImageClassification`` (torchvision is
not a dependency): bottleneck blocks, stem width 64, stage widths 256/512/1024/2048,
1000 classes. Its parameter count equals torchvision's (25,557,032 for ResNet-50,
44,549,160 for ResNet-101), so gradient bytes and DDP buckets are those of the paper.

Example::

    from ccddp.workloads import get_workload

    wl = get_workload("resnet50", size="tiny")
    model = wl.build_model()
    loss = wl.loss(model, wl.make_batch(step=0, rank=0, world_size=1))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ccddp.errors import ConfigError
from ccddp.workloads.base import Workload, int_setting
from ccddp.workloads.synthetic import IMAGENET_CLASSES, imagenet_batch

_RESNET_WIDTHS = [256, 512, 1024, 2048]


def _preset(depths: list[int], batch_size: int) -> dict[str, Any]:
    return {
        "batch_size": batch_size,
        # ImageNet's training resolution: kept, so input bytes per image (what the
        # bounce path seals) are those of the paper.
        "image_size": 224,
        "dtype": "float32",
        "seed": 0,
        "depths": tuple(depths),
        "hidden_sizes": tuple(_RESNET_WIDTHS),
        "embedding_size": 64,
        "num_classes": IMAGENET_CLASSES,
    }


_TINY = {
    "batch_size": 2,
    "image_size": 32,
    "dtype": "float32",
    "seed": 0,
    "hidden_sizes": (16, 32),
    "embedding_size": 8,
    "num_classes": IMAGENET_CLASSES,
}


class ResNetWorkload(Workload):
    """ResNet image classification with cross-entropy over 1000 ImageNet classes."""

    family = "vision"
    PRESETS: Mapping[str, Mapping[str, Any]] = {}

    def _validate(self) -> None:
        s = self.settings
        int_setting(s, "image_size", 32)  # five stride-2 stages
        if len(s["depths"]) != len(s["hidden_sizes"]):
            raise ConfigError("depths and hidden_sizes must have the same length")

    def _create_model(self) -> torch.nn.Module:
        from transformers import ResNetConfig, ResNetForImageClassification

        s = self.settings
        config = ResNetConfig(
            layer_type="bottleneck",
            depths=list(s["depths"]),
            hidden_sizes=list(s["hidden_sizes"]),
            embedding_size=int(s["embedding_size"]),
            num_labels=int(s["num_classes"]),
        )
        return ResNetForImageClassification(config)

    def make_batch(self, step: int, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
        gen = self._chunk_generator(step, rank, world_size)
        s = self.settings
        return imagenet_batch(gen, self.batch_size, int(s["image_size"]), self.param_dtype,
                              num_classes=int(s["num_classes"]))

    def loss(self, model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return model(pixel_values=batch["pixel_values"], labels=batch["labels"]).loss


class ResNet50(ResNetWorkload):
    # Batch 8 at 224x224: one fwd+bwd is ~200 GFLOP, a few seconds per rank on one core.
    PRESETS = {"default": _preset([3, 4, 6, 3], batch_size=8),
               "tiny": {**_TINY, "depths": (1, 1)}}


class ResNet101(ResNetWorkload):
    PRESETS = {"default": _preset([3, 4, 23, 3], batch_size=8),
               "tiny": {**_TINY, "depths": (1, 2)}}
