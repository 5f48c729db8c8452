"""PyTorch's own backend suite, ``torch.testing._internal.distributed.distributed_test``
(what gloo and NCCL are tested with), on the backend named by ``BACKEND``.

Run through scripts/torch_conformance.sh, which sets ``BACKEND``, ``WORLD_SIZE``,
``TEMP_DIR`` and the key material. For ``ccddp`` the suite's feature table is told what a
CPU plugin backend supports (DDP, subgroups), as PyTorch's own backends declare theirs;
nothing else about the suite changes.
"""

import os

import ccddp.backend  # noqa: F401  (registers "ccddp" in this process and in spawned ranks)
from torch.testing._internal.common_distributed import DistTestCases

if os.environ["BACKEND"] == "ccddp":
    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add("ccddp")

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestConformance(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
