"""The engine: sealed collectives over point-to-point links.

How a ``dist.all_reduce(t)`` on a ccddp group reaches the wire and comes back, each step
one module, none reaching back up:

1. ``backend.process_group.ProcessGroupCCDDP.allreduce``, the record ``ALL_REDUCE`` of the
   backend's op table (``backend.ops``), checks the op once (dtype, reduction, device,
   layout; a contiguous copy if needed: ``backend.calls``) and queues a job on the group's
   ``backend.queue.OpQueue``; the caller gets a work whose future the queue completes. The
   queue runs one op at a time and counts what each sealed and opened under its c10d name
   (``ProcessGroupCCDDP.crypto_counters(op)``).
2. The job calls ``collectives.run_all_reduce(endpoint, flat, reduction)`` -- the engine's
   entry points (``run_*``) take checked input and an ``endpoint.Endpoint``: the group's
   agreed ``session.Session`` (keys, session id, settings; made by ``session.establish``)
   with its links, channels, frame arenas and sequence counter. It numbers the
   collective, posts a sealed descriptor to its neighbours (``descriptors.Descriptors``:
   ranks that call different collectives fail with what differs) and picks the schedule: ``plan.ring_plan`` (steps as
   data), run by ``pipeline`` (segments sealed on crypto threads while earlier ones are
   in flight), or, measurement-only, ``naive`` (``secure-naive``: the paper's whole-chunk
   schedule) or ``tree`` -- reached only where a benchmark's settings name them
   (``Options(settings=...)``; a group made from ``CCDDP_SETTINGS`` refuses them:
   ``backend.ops.refuse_measurement_only``); a two-rank all-reduce of at most 1 MiB is
   ``plan.exchange_plan``, one sealed exchange (issue 42). ``probe`` (``CCDDP_PROBE``)
   times each stage of an op, off by default.
3. Each schedule cuts its steps into typed frames (``frames.FrameSpec``: step, segment,
   peer, region), takes their memory from the endpoint's ``frames.FrameArena`` and seals
   and opens them on the endpoint's link channels (``endpoint.channels``, a
   ``channels.LinkChannels``: ``tx(peer)``/``rx(peer)``, one ``crypto.channel.LinkChannel``
   per link direction, AES-256-GCM, counter nonces, the frame's context as AAD).
4. ``transport.Transport`` moves the frames on bare gloo connection sets (one per link
   direction) with finite waits: every byte the host sees passes there, which is where the
   tests' adversary sits (``ccddp.testing.adversary``).

The engine holds the sealed schedules (``secure``; the measurement-only ``secure-naive``
and ``tree``) and the unsealed ring (``ring``), which the trust-domain hierarchy runs
inside a domain (``hierarchy``). What only measurements use -- gloo's own collectives, the
CC-off reference, and collectives that check any caller's tensors before calling ``run_*``
-- lives in ``ccddp.bench.reference``.

Example::

    dist.init_process_group("ccddp")        # the product: the backend
    dist.all_reduce(grads)                   # steps 1-4 above
"""

from ccddp.comm.endpoint import Endpoint
from ccddp.comm.group import SecureGroup
from ccddp.comm.session import Session, establish, key_source_from_env
from ccddp.comm.settings import IMPLS, CommSettings
from ccddp.comm.transport import Transport

__all__ = ["Endpoint", "Session", "establish", "key_source_from_env", "SecureGroup", "CommSettings", "IMPLS",
           "Transport"]
