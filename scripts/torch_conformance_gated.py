"""The tests of PyTorch's backend suite that it runs only on gloo (timeouts, monitored
barriers, batched point-to-point, sparse all-reduce), on ccddp: the suite runs with
``BACKEND=gloo`` and every rank serves its groups with ccddp, as under ``ccddp launch``
(``ccddp.backend.intercept``: ``init_process_group("gloo")`` becomes ``"ccddp"``).

    BACKEND=gloo WORLD_SIZE=2 TEMP_DIR=$(mktemp -d) CCDDP_GROUP_SECRET=... \\
        python -m pytest scripts/torch_conformance_gated.py -k "barrier_timeout or monitored_barrier ..."

(scripts/torch_compat.sh runs the selection.)
"""

import os
import sys

from ccddp.backend.intercept import install

install()  # here and in every rank the suite spawns (they import this module)

sys.path.insert(0, os.path.dirname(__file__))
import torch_conformance  # noqa: E402


class TestGated(torch_conformance.TestConformance):
    """Defined here, so that the ranks the suite spawns import this module (and so the
    interceptor above), not torch_conformance."""
