"""``ProcessGroupCCDDP``: the torch.distributed process group of the ``ccddp`` backend.

torch creates one per ``init_process_group("ccddp")`` / ``new_group(backend="ccddp")`` and
registers it like any group, so every API that takes a group works with it. Its c10d
collectives are one table (:mod:`ccddp.backend.ops`); point-to-point messages and
``monitored_barrier`` are sealed and posted on the calling thread (:mod:`ccddp.backend.peers`).
An op, reduction or dtype ccddp cannot run sealed raises a :class:`ConfigError` naming it:
there is no plaintext fallback. The path of a sealed ``dist.all_reduce(t)``:

1. torch calls ``ProcessGroupCCDDP.allreduce(tensors, opts)`` (``ops.method(ops.ALL_REDUCE)``),
   which runs :meth:`~ProcessGroupCCDDP._run` on the caller's thread: the record's
   ``check`` (``ops._check_all_reduce``: one dense CPU or CUDA tensor, a reduction defined
   for its dtype) and ``stage`` (``calls.stage``: a contiguous buffer, or a pinned host
   copy where a CUDA tensor's placement is staged); :meth:`_submit` queues ``Op.run`` on
   the group's ``backend.queue.OpQueue`` (``submit``) and returns a
   ``backend.work.CollectiveWork``, whose future completes once the job has run;
2. on the queue's thread ``Op.run`` calls the engine entry point ``ops._all_reduce`` ->
   ``comm.collectives.run_all_reduce(pg.endpoint, ...)`` (``comm.hierarchy.hierarchical_all_reduce``
   with trust domains), then the write-back (``calls.write_back``); ``__init__`` made the
   ``comm.endpoint.Endpoint`` on a session from ``comm.session.establish`` (keys, session id);
3. ``collectives._run_ring`` posts a sealed descriptor to each neighbour
   (``comm.descriptors``) and runs the ring's steps (``comm.plan.ring_plan``) in
   ``comm.pipeline.run_pipelined``: each segment sealed on its link's channel
   (``_Pipeline.send_frame``: ``endpoint.channels.tx(peer).seal_job``, a
   ``crypto.channel.LinkChannel``, AES-256-GCM), each received one opened (``open_job``);
4. ``endpoint.transport.isend``/``irecv`` (``comm.transport.Transport``) post the frames on
   bare gloo connection sets (:mod:`ccddp.backend.links`, one per link direction): the wire.

Those gloo sets come from a ``PrefixStore`` of the group's store: collectives,
point-to-point, and, with trust domains larger than one rank, the domain's plaintext
AF_UNIX links (:mod:`ccddp.backend.local_links`) and the shard's sealed ring across
domains (all-reduce, broadcast and equal reduce-scatter then run :mod:`ccddp.comm.hierarchy`).
They are registered nowhere: users, torch's group registry and ``torch.compile`` never see
them, and every op method is kept out of dynamo's tracing (:mod:`ccddp.backend.eager`).

Example::

    dist.init_process_group("ccddp")           # under torchrun; CCDDP_GROUP_SECRET set
    dist.all_reduce(torch.ones(4), op=dist.ReduceOp.MAX)   # sealed on every hop
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from ccddp.backend import ops
from ccddp.backend.calls import device_of, flatten
from ccddp.backend.device_backend import register_device_backends
from ccddp.backend.eager import keep_eager
from ccddp.backend.links import device_wire, domain_links, group_store, internal_links, prove_domains
from ccddp.backend.peers import monitored_barrier, recv, recv_anysource, send
from ccddp.backend.placement import DeviceOrder, Placement, choose, rates_from_profile
from ccddp.backend.queue import OpQueue
from ccddp.backend.registration import BACKEND_NAME, SETTINGS_ENV, Options, settings_from_env
from ccddp.backend.work import CollectiveWork
from ccddp.comm import Endpoint, establish
from ccddp.comm.control import gather_sealed
from ccddp.comm.p2p import SealedPeerLinks
from ccddp.comm.transport import Transport
from ccddp.crypto.counters import CryptoCounters
from ccddp.crypto.device import triton_available
from ccddp.errors import ConfigError

# The c10d methods a per-device backend forwards to its group (torch calls them on the backend).
_DEVICE_OPS = tuple(op.method for op in ops.TABLE) + ("monitored_barrier", "send", "recv", "recv_anysource")


class ProcessGroupCCDDP(dist.ProcessGroup):
    """One ccddp process group; see the module docstring."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, options: Options | None = None, *,
                 group_id: str = "", global_ranks: list[int] | None = None) -> None:
        super().__init__(rank, size)
        options = options or Options()
        settings = options.settings or settings_from_env(timeout.total_seconds())
        if not settings.secure:
            raise ConfigError(f"the ccddp backend runs sealed collectives only (impl secure or secure-naive), "
                              f"got impl {settings.impl!r}")
        if options.settings is None:  # the default path: the product's schedule only
            ops.refuse_measurement_only(settings, SETTINGS_ENV)
        gloo_timeout = timedelta(seconds=max(settings.timeout_s, timeout.total_seconds()))
        ranks = global_ranks if global_ranks is not None else list(range(size))
        store = group_store(store, rank)    # keys of this group instance's own
        self._internal = coll, down, p2p = internal_links(store, rank, size, gloo_timeout)
        transport = Transport(coll, settings.timeout_s, downward=down)
        # The session (keys, a fresh session id), then the endpoint the engine runs on (links, channels).
        self.endpoint = Endpoint(establish(transport, settings, options.key_source(settings), ranks=ranks), transport)
        # Trust domains larger than one rank, proven (ranks that reached each other over sockets that
        # cannot leave the machine): plaintext only on those local links (ops.py: which ops use them).
        self.domains, local = prove_domains(self.endpoint)
        self.domain_links = None if local is None else domain_links(store, rank, self.domains, local,
                                                                     self.endpoint, ranks, gloo_timeout)
        self.peer_links = SealedPeerLinks(self.endpoint, Transport(p2p, settings.timeout_s))
        self.settings = settings
        self.queue = OpQueue(f"ccddp-group-{group_id or 'default'}", counters=self._collective_counters)
        self._order = DeviceOrder()
        # The device frames' wire is chosen at the first CUDA op: the store is kept for NCCL's rendezvous.
        self._store = store
        self._wire_chosen = False
        self._placements: dict[torch.device, Placement] = {}
        self._group_name = group_id
        self._group_desc = ""
        # Registration with torch (torch_private, issue 39): the group is its own per-device backend.
        self._device_backend = None
        register_device_backends(self, _DEVICE_OPS)

    # -- identity --------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    def __repr__(self) -> str:
        return f"ProcessGroupCCDDP(rank={self.rank()}, size={self.size()}, name={self._group_name!r})"

    # -- the table's ops (ccddp.backend.ops) -----------------------------------------------
    allreduce = ops.method(ops.ALL_REDUCE)
    allreduce_coalesced = ops.method(ops.ALL_REDUCE_COALESCED)
    reduce = ops.method(ops.REDUCE)
    broadcast = ops.method(ops.BROADCAST)
    allgather = ops.method(ops.ALL_GATHER)
    allgather_coalesced = ops.method(ops.ALL_GATHER_COALESCED)
    _allgather_base = all_gather_single = ops.method(ops.ALL_GATHER_INTO_TENSOR)
    allgather_into_tensor_coalesced = all_gather_single_coalesced = ops.method(ops.ALL_GATHER_INTO_TENSOR_COALESCED)
    reduce_scatter = ops.method(ops.REDUCE_SCATTER)
    _reduce_scatter_base = reduce_scatter_single = ops.method(ops.REDUCE_SCATTER_TENSOR)
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced = ops.method(ops.REDUCE_SCATTER_TENSOR_COALESCED)
    alltoall_base = all_to_all_single = ops.method(ops.ALL_TO_ALL_SINGLE)
    alltoall = ops.method(ops.ALL_TO_ALL)
    gather = ops.method(ops.GATHER)
    scatter = ops.method(ops.SCATTER)
    barrier = ops.method(ops.BARRIER)

    # -- the ops outside the table: sealed point-to-point messages (ccddp.backend.peers) --------
    monitored_barrier, send, recv, recv_anysource = monitored_barrier, send, recv, recv_anysource

    # -- queueing --------------------------------------------------------------------
    def _run(self, op: ops.Op, *args, **kwargs) -> CollectiveWork:
        """``op`` checked and staged here, on the caller's thread, then queued."""
        result, inputs, calls = op.check(self, *args, **kwargs)
        for call in calls:
            op.stage(self, call)
        return self._submit(op.name, lambda: op.run(self, calls), result, inputs)

    def _submit(self, op: str, job: Callable[[], None], result, inputs=()) -> CollectiveWork:
        device = device_of(flatten(result) + flatten(inputs))
        devices = None
        if device is not None:
            # After the op's staging copies were queued (_run makes them first).
            job = self._order.after_caller(self._choosing_wire(job, device), device)
            devices = [device]
        return CollectiveWork(self.queue, self.queue.submit(job, result, op, devices=devices), op)

    # -- device tensors ----------------------------------------------------------------
    def _choosing_wire(self, job: Callable[[], None], device: torch.device) -> Callable[[], None]:
        """``job``, preceded at the group's first CUDA op by the choice of the wire for device frames
        (collective: every rank's first CUDA op is the same; a failed choice is not retried, so the ranks
        stay in step), on GPU reports gathered sealed: the host can neither read nor split them."""
        if self._wire_chosen:
            return job

        def choosing() -> None:
            if not self._wire_chosen and self.endpoint.transport.ordered is None:
                self._wire_chosen = True
                self.endpoint.transport.ordered = device_wire(self._store, self.rank(), self.size(), self.settings,
                                                              lambda blob: gather_sealed(blob, self.endpoint), device)
            job()

        return choosing

    @property
    def device_wire(self) -> str | None:
        """What carries this group's device frames: ``"NCCL"`` (the ordered wire's name),
        ``"gloo"``, or None before the group's first op on CUDA tensors chose."""
        wire = self.endpoint.transport.ordered
        if wire is not None:
            return wire.name
        return "gloo" if self._wire_chosen else None

    def placement(self, device: torch.device) -> Placement:
        """Where ops on ``device`` are sealed (``ccddp.backend.placement``), decided once."""
        got = self._placements.get(device)
        if got is None:
            got = self._placements[device] = choose(self.settings.placement, device, triton=triton_available(),
                                                    rates=rates_from_profile())
        return got

    # -- counters --------------------------------------------------------------------------
    @property
    def calls(self) -> dict[str, int]:
        """How many c10d operations of each name were issued on this group."""
        return dict(self.queue.submitted)

    def _collective_counters(self) -> tuple:
        """The collectives' crypto counters (``CryptoCounters.values``): this group's links and
        the sealed shard ring's across trust domains."""
        mine, cross = self.endpoint.counters.values(), self.domain_links and self.domain_links.cross
        return mine if cross is None else tuple(a + b for a, b in zip(mine, cross.counters.values()))

    def crypto_counters(self, op: str | None = None) -> dict:
        """A snapshot of this group's crypto counters (``CryptoCounters`` fields): every op's
        and point-to-point message's, or, with ``op``, only what the ops of that c10d name
        (as in :attr:`calls`) sealed and opened: ``pg.crypto_counters("all_reduce")["bytes_sealed"]``."""
        if op is not None:
            return self.queue.counted.get(op)
        collective = CryptoCounters.as_dict(self._collective_counters())
        return CryptoCounters.total([collective, self.peer_links.counters.snapshot()])

    def counters_by_op(self) -> dict[str, dict]:
        """Crypto counters per c10d op name, of the ops run so far (sent and received
        point-to-point messages are counted in :meth:`crypto_counters` only)."""
        return self.queue.counted.snapshot()

    @property
    def current_op(self) -> str | None:
        """The c10d operation this group's op queue is running (None between ops)."""
        running = self.queue.running
        return running.op if running is not None else None

    # -- life -----------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the op queue and the crypto threads (``destroy_process_group`` calls this).
        The internal gloo links go with the process: gloo closes sockets abortively, and a
        peer may still be reading its last frames."""
        self.queue.close()
        if self.endpoint.transport.ordered is not None:
            self.endpoint.transport.ordered.close()
        self.endpoint.close()

    def abort(self) -> None:
        self.shutdown()


# Every c10d entry point, aliases included, is kept out of dynamo's tracing (ccddp.backend.eager).
_ENTRY_POINTS = {id(vars(ProcessGroupCCDDP)[name]) for name in _DEVICE_OPS}
keep_eager(ProcessGroupCCDDP, *(name for name, fn in vars(ProcessGroupCCDDP).items() if id(fn) in _ENTRY_POINTS))
