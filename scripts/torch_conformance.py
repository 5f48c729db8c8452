"""PyTorch's own backend suite, ``torch.testing._internal.distributed.distributed_test``
(what gloo and NCCL are tested with), on the backend named by ``BACKEND``.

Run through scripts/torch_conformance.sh, which sets ``BACKEND``, ``WORLD_SIZE``,
``TEMP_DIR`` and the key material. For ``ccddp`` the suite's feature table is told what a
CPU plugin backend supports (DDP, subgroups), as PyTorch's own backends declare theirs;
nothing else about the suite changes.
"""

import os

import torch
import ccddp.backend  # noqa: F401  (registers "ccddp" in this process and in spawned ranks)
from torch.testing._internal.common_distributed import DistTestCases

if os.environ["BACKEND"] == "ccddp":
    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add("ccddp")

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


#: Modules a fork server imports once, so that each rank it forks starts in ~0.1 s instead
#: of importing torch and the suite afresh (~4 s of CPU a rank, two ranks a test). This
#: module is imported first: it tells the suite's feature table about ccddp before the
#: suite's decorators read it.
FORKSERVER_PRELOAD = [__name__]


class _ProcessWithCallersEnvironment(torch.multiprocessing.get_context("forkserver").Process):
    """A rank forked from the fork server, run under the caller's environment of the
    moment it starts (the suite sets ``TEMP_DIR`` afresh for each test; the server kept
    the environment it started with)."""

    def start(self):
        self._caller_environment = dict(os.environ)
        super().start()

    def run(self):
        os.environ.clear()
        os.environ.update(self._caller_environment)
        super().run()


def _start_fork_server_ranks(test) -> None:
    # Python 3.11's fork server ignores the caller's sys.path; it finds this module (and
    # ccddp) through PYTHONPATH, which it inherits when it starts.
    here = os.path.dirname(os.path.abspath(__file__))
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *filter(None, paths)])
    torch.multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    test._start_processes(_ProcessWithCallersEnvironment)


class TestConformance(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        # CONFORMANCE_START=forkserver: ranks forked from one process that imported the
        # suite once (tests/test_conformance_subset.py); by default each rank is spawned,
        # as PyTorch runs this suite.
        if os.environ.get("CONFORMANCE_START", "spawn") == "forkserver":
            _start_fork_server_ranks(self)
        else:
            self._spawn_processes()
