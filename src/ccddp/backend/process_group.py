"""``ProcessGroupCCDDP``: the torch.distributed process group of the ``ccddp`` backend.

torch creates one per ``init_process_group("ccddp")`` / ``new_group(backend="ccddp")`` and
registers it like any group (name, rank map), so every API that takes a group works with
it. Each c10d operation is checked on the calling thread (an operation, reduction or
dtype ccddp cannot run sealed raises :class:`ConfigError` naming it: there is no plaintext
fallback), then queued on the group's :class:`OpQueue`, which runs it as a sealed ccddp
collective (``ccddp.comm``) while the caller goes on (or on the caller's own thread, when
it waits for the op before the queue's worker has started it); the returned work's
future completes once it has run. Point-to-point messages are sealed and posted on the calling
thread, on links of their own.

Inside, the group keeps bare gloo connection sets built from a ``PrefixStore`` of the
group's own store (:mod:`ccddp.backend.links`): collectives (one per link direction) and
point-to-point messages, and, with trust domains larger than one rank
(``CommSettings.trust_domains``), its domain's plaintext set (AF_UNIX links to ranks
that proved they share the machine, :mod:`ccddp.backend.local_links`) and its
shard's sealed ring across domains, over which all-reduce, broadcast and reduce-scatter
(equal chunks) run hierarchically
(:mod:`ccddp.comm.hierarchy`). They are registered nowhere: users, torch's group registry
and ``torch.compile`` never see them, and every op method is kept out of dynamo's tracing
(``torch.compiler.disable``).

Example::

    dist.init_process_group("ccddp")           # under torchrun; CCDDP_GROUP_SECRET set
    t = torch.ones(4)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)   # sealed on every hop
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from ccddp.backend.placement import DeviceOrder, Placement, choose, rates_from_profile, stage_in, stage_out
from ccddp.backend.queue import OpQueue
from ccddp.backend.registration import BACKEND_NAME, Options, settings_from_env
from ccddp.backend.work import CollectiveWork, PeerWork
from ccddp.comm import SecureGroup
from ccddp.comm.collectives import run_all_gather, run_all_reduce, run_broadcast, run_reduce_scatter
from ccddp.comm.exchange import all_to_all, gather, scatter
from ccddp.comm.p2p import SealedPeerLinks
from ccddp.comm.plan import sized_bounds
from ccddp.comm.reduce import Reduction
from ccddp.backend.links import device_wire, domain_links, internal_links, prove_domains
from ccddp.comm.hierarchy import hierarchical_all_reduce, hierarchical_broadcast, hierarchical_reduce_scatter
from ccddp.comm.transport import Transport
from ccddp.crypto.counters import CryptoCounters
from ccddp.crypto.device import triton_available
from ccddp.errors import ConfigError, PeerTimeoutError

_eager = torch.compiler.disable


# torch's reduction types to ccddp's (PREMUL_SUM, NCCL's pre-multiplied sum, has none).
_REDUCTIONS = {getattr(dist.ReduceOp.RedOpType, red.name).value: red for red in Reduction}
# (dtype, torch reduction) pairs already checked: a synchronous call pays for every check
# on top of its sealed op, so each pair is checked once.
_CHECKED: dict[tuple[torch.dtype, int], Reduction] = {}


def _reduction(opts, dtype: torch.dtype, what: str) -> Reduction:
    """ccddp's reduction for torch's ``opts.reduceOp``, checked against ``dtype``."""
    op = opts.reduceOp.op.value if opts is not None else dist.ReduceOp.RedOpType.SUM.value
    red = _CHECKED.get((dtype, op))
    if red is not None:
        return red
    red = _REDUCTIONS.get(op)
    if red is None:
        raise ConfigError(f"{what}: {opts.reduceOp.op.name} (NCCL's pre-multiplied sum) is not supported by "
                          "the ccddp backend")
    red.check(dtype, what)
    _CHECKED[(dtype, op)] = red
    return red


def _check(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.layout != torch.strided:
        raise ConfigError(f"{what}: {t.layout} tensors are not supported by the ccddp backend (dense tensors only)")
    if t.device.type not in ("cpu", "cuda"):
        raise ConfigError(f"{what}: the ccddp backend seals CPU and CUDA tensors, got one on {t.device}")
    return t


def _device_of(tensors) -> torch.device | None:
    """The CUDA device an op's tensors are on (None: host memory only)."""
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    if len(devices) > 1:
        raise ConfigError(f"the ccddp backend takes the tensors of one op on one device, got {sorted(map(str, devices))}")
    return devices.pop() if devices else None


def _devices(t: torch.Tensor) -> list[torch.device] | None:
    """What a work's future must be made for (c10d's CUDA-aware futures), if anything."""
    return [t.device] if t.device.type == "cuda" else None


def _flatten(tensors) -> list[torch.Tensor]:
    out = []
    for t in tensors:
        if isinstance(t, torch.Tensor):
            out.append(t)
        else:
            out.extend(_flatten(t))
    return out


def _one(tensors: list[torch.Tensor], what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ConfigError(f"{what}: the ccddp backend takes one tensor per call, got {len(tensors)}")
    return _check(tensors[0], what)


def _nothing() -> None:
    pass


def _staged(t: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
    """A contiguous tensor to work in, and what copies it back into ``t`` afterwards."""
    if t.is_contiguous():
        return t, _nothing
    buf = t.contiguous()
    return buf, lambda: t.copy_(buf)


def _same_dtype(tensors: list[torch.Tensor], what: str) -> torch.dtype:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise ConfigError(f"{what}: all tensors must share one dtype, got {sorted(map(str, dtypes))}")
    return dtypes.pop()


def _splits(t: torch.Tensor, sizes: list[int], n: int, what: str) -> list[torch.Tensor]:
    """``t`` cut along dim 0 into ``sizes`` rows (equal parts if empty)."""
    rows = t.shape[0] if t.dim() else 1
    if not sizes:
        if rows % n:
            raise ConfigError(f"{what}: {rows} rows do not split evenly over {n} ranks; pass split sizes")
        sizes = [rows // n] * n
    if len(sizes) != n or sum(sizes) != rows:
        raise ConfigError(f"{what}: split sizes {list(sizes)} do not cover {rows} rows over {n} ranks")
    flat = t if t.dim() else t.view(1)
    out, start = [], 0
    for s in sizes:
        out.append(flat.narrow(0, start, s))
        start += s
    return out


# The point-to-point tag of monitored_barrier's sealed reports: a stream (key, counter) of
# its own, above any tag torch's tools use.
_MONITORED_TAG = (1 << 31) - 1 - 0x4D42  # gloo takes a C int

# The c10d operations a per-device backend forwards to its group (torch calls a backend's
# ops by these names where it holds the backend rather than the group).
_DEVICE_OPS = ("allreduce", "allreduce_coalesced", "reduce", "broadcast", "allgather", "allgather_coalesced",
               "_allgather_base", "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base",
               "reduce_scatter_tensor_coalesced", "alltoall_base", "alltoall", "gather", "scatter", "barrier",
               "monitored_barrier", "send", "recv", "recv_anysource")


def _device_backend_class():
    """The per-device c10d ``Backend`` of a ccddp group: every op is the group's own
    (sealed) method, so ``pg._get_backend(device).allreduce(...)`` and
    ``pg.allreduce(...)`` are the same op. It coalesces nothing and splits nothing, as
    gloo (``batch_isend_irecv`` then posts each message on its own, as it does on gloo)."""
    import weakref

    from ccddp.backend.torch_private import _C10D

    class DeviceBackend(_C10D.Backend):
        # Plain attributes: the pybind11 properties of these would call back into Python
        # for the override and recurse.
        supports_coalescing = False
        supports_splitting = False
        supports_time_estimate = False
        supports_tensor_alloc = False
        supports_shrinking = False

        def __init__(self, group: "ProcessGroupCCDDP") -> None:
            super().__init__(group.rank(), group.size())
            self._group = weakref.ref(group)  # the group holds the backend, not the other way round

        def _of(self) -> "ProcessGroupCCDDP":
            group = self._group()
            if group is None:
                raise ConfigError("this ccddp backend's process group was destroyed")
            return group

        def getBackendName(self) -> str:
            return BACKEND_NAME

        def name(self) -> str:
            return BACKEND_NAME

    def forward(op: str):
        def call(self, *args, **kwargs):
            return getattr(self._of(), op)(*args, **kwargs)

        call.__name__ = op
        return call

    for op in _DEVICE_OPS:
        setattr(DeviceBackend, op, forward(op))
    return DeviceBackend


_DEVICE_BACKEND = None


def register_device_backends(group: "ProcessGroupCCDDP") -> None:
    """Register ``group`` as its own CPU and CUDA backend, the way torch's groups are
    (``_register_backend`` per device, ``_set_default_backend``), so that what torch asks
    a group for its per-device backend (``_get_backend``, ``_get_backend_name``,
    ``batch_isend_irecv`` from torch 2.15, the coalescing managers) finds ccddp. Torches
    that cannot host a Python ``Backend`` (2.11 to 2.13) do not ask this of a Python group;
    there the group stays as it was (``_get_backend`` does not resolve)."""
    global _DEVICE_BACKEND
    from ccddp.backend.torch_private import python_backend_allowed

    if not python_backend_allowed():
        return
    if _DEVICE_BACKEND is None:
        _DEVICE_BACKEND = _device_backend_class()
    backend = _DEVICE_BACKEND(group)
    group._device_backend = backend  # kept alive with the group: torch's reference is C++ only
    custom = dist.ProcessGroup.BackendType.CUSTOM
    for device in ("cpu", "cuda"):
        group._register_backend(torch.device(device), custom, backend)
    group._set_default_backend(custom)


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
        gloo_timeout = timedelta(seconds=max(settings.timeout_s, timeout.total_seconds()))
        ranks = global_ranks if global_ranks is not None else list(range(size))
        coll, down, p2p = internal_links(store, rank, size, gloo_timeout)
        self._internal = (coll, down, p2p)
        transport = Transport(coll, settings.timeout_s, downward=down)
        self.secure_group = SecureGroup(settings, options.secret, pg=coll, transport=transport, ranks=ranks,
                                        establishment=options.establishment)
        # Trust domains larger than one rank, proven (ranks that reached each other over
        # sockets that cannot leave the machine): all-reduce, broadcast and reduce-scatter
        # (equal chunks) go hierarchical, plaintext only on those local links; every other
        # op stays sealed end to end.
        self.domains, endpoint = prove_domains(self.secure_group)
        self.domain_links = None if endpoint is None else domain_links(store, rank, self.domains, endpoint,
                                                                        self.secure_group, ranks, gloo_timeout)
        self.peer_links = SealedPeerLinks(self.secure_group, Transport(p2p, settings.timeout_s))
        self.settings = settings
        self.queue = OpQueue(f"ccddp-group-{group_id or 'default'}", counters=self._collective_counters)
        self._order = DeviceOrder()
        # The wire of device frames is chosen at the first op on CUDA tensors (a group that
        # never has one never touches CUDA): the store is kept for the NCCL wire's rendezvous.
        self._store = store
        self._wire_chosen = False
        self._placements: dict[torch.device, Placement] = {}
        self._group_name = group_id
        self._group_desc = ""
        # Registration with torch (torch_private, issue 39): the group is its own per-device backend.
        self._device_backend = None
        register_device_backends(self)

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

    # -- queueing --------------------------------------------------------------------
    def _submit(self, op: str, job: Callable[[], None], result, inputs=()) -> CollectiveWork:
        device = _device_of(_flatten(result) + _flatten(inputs))
        devices = None
        if device is not None:
            # After the op's staging copies were queued (the op methods make them first).
            job = self._order.after_caller(self._choosing_wire(job, device), device)
            devices = [device]
        return CollectiveWork(self.queue, self.queue.submit(job, result, op, devices=devices), op)

    # -- device tensors ----------------------------------------------------------------
    def _choosing_wire(self, job: Callable[[], None], device: torch.device) -> Callable[[], None]:
        """``job``, preceded at the group's first CUDA op by the choice of the wire for device
        frames (collective: every rank's first CUDA op is the same op; a choice that fails
        is not tried again, so the ranks stay in step)."""
        if self._wire_chosen:
            return job

        def choosing() -> None:
            transport = self.secure_group.transport
            if not self._wire_chosen and transport.ordered is None:
                self._wire_chosen = True
                transport.ordered = device_wire(self._store, self.rank(), self.size(), self.settings,
                                                transport.exchange, device)
            job()

        return choosing

    @property
    def device_wire(self) -> str | None:
        """What carries this group's device frames: ``"NCCL"`` (the ordered wire's name),
        ``"gloo"``, or None before the group's first op on CUDA tensors chose."""
        wire = self.secure_group.transport.ordered
        if wire is not None:
            return wire.name
        return "gloo" if self._wire_chosen else None

    def placement(self, device: torch.device) -> Placement:
        """Where ops on ``device`` are sealed (``ccddp.backend.placement``); decided once
        per device."""
        got = self._placements.get(device)
        if got is None:
            got = self._placements[device] = choose(self.settings.placement, device, triton=triton_available(),
                                                    rates=rates_from_profile())
        return got

    def _through_host(self, t: torch.Tensor, sealed_there: bool) -> bool:
        """Whether ``t``'s op runs on a host copy: a CUDA tensor whose op is staged, by the
        placement or because the op runs on host memory only (``sealed_there`` False)."""
        return t.device.type == "cuda" and (not sealed_there or self.placement(t.device) is Placement.STAGED)

    def _working(self, t: torch.Tensor, sealed_there: bool = True) -> tuple[torch.Tensor, Callable[[], None]]:
        """The contiguous buffer an op works in for ``t`` and what writes it back into
        ``t`` afterwards: ``t``'s own memory where possible, else a contiguous copy on its
        device, or a host copy when the op is staged (``sealed_there``: whether this op
        can run on the device at all)."""
        if self._through_host(t, sealed_there):
            return stage_out(t)
        return _staged(t)

    def _input(self, t: torch.Tensor, sealed_there: bool = True) -> torch.Tensor:
        """A contiguous read-only input where the op runs (see :meth:`_working`)."""
        if self._through_host(t, sealed_there):
            return stage_in(t)
        return t.contiguous()

    @property
    def calls(self) -> dict[str, int]:
        """How many c10d operations of each name were issued on this group."""
        return dict(self.queue.submitted)

    def _collective_counters(self) -> dict:
        """The collectives' crypto counters: this group's links and the sealed shard ring's
        across trust domains."""
        groups = [self.secure_group]
        if self.domain_links is not None and self.domain_links.cross is not None:
            groups.append(self.domain_links.cross)
        return CryptoCounters.total([g.counters.snapshot() for g in groups])

    def crypto_counters(self, op: str | None = None) -> dict:
        """A snapshot of this group's crypto counters (``CryptoCounters`` fields): every op's
        and point-to-point message's, or, with ``op``, only what the ops of that c10d name
        (as in :attr:`calls`: ``"all_reduce"``, ``"broadcast"``, ...) sealed and opened.

        Example::

            grads = pg.crypto_counters("all_reduce")["bytes_sealed"]
        """
        if op is not None:
            return self.queue.counted.get(op)
        return CryptoCounters.total([self._collective_counters(), self.peer_links.counters.snapshot()])

    def counters_by_op(self) -> dict[str, dict]:
        """Crypto counters per c10d op name, of the ops run so far (sent and received
        point-to-point messages are counted in :meth:`crypto_counters` only)."""
        return self.queue.counted.snapshot()

    @property
    def current_op(self) -> str | None:
        """The c10d operation this group's op queue is running (None between ops)."""
        running = self.queue.running
        return running.op if running is not None else None

    # -- all-reduce and reduce ---------------------------------------------------------
    def _all_reduce(self, flat: torch.Tensor, red: Reduction) -> None:
        if self.domain_links is not None:
            hierarchical_all_reduce(self.domain_links, flat, red)
        else:
            run_all_reduce(self.secure_group, flat, red)

    @_eager
    def allreduce(self, tensors, opts=None):
        t = _one(tensors, "all_reduce")
        red = _reduction(opts, t.dtype, "all_reduce")
        buf, back = self._working(t)

        def job() -> None:
            self._all_reduce(buf.view(-1), red)
            back()

        return self._submit("all_reduce", job, tensors)

    @_eager
    def allreduce_coalesced(self, tensors, opts=None):
        red = Reduction.SUM  # (no tensors: nothing to reduce)
        for t in tensors:
            red = _reduction(opts, _check(t, "all_reduce_coalesced").dtype, "all_reduce_coalesced")
        staged = [self._working(t) for t in tensors]

        def job() -> None:
            alike: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
            for buf, _ in staged:
                alike.setdefault((buf.dtype, buf.device), []).append(buf)
            for same in alike.values():
                flat = torch.cat([b.reshape(-1) for b in same])
                self._all_reduce(flat, red)
                for b, part in zip(same, flat.split([b.numel() for b in same])):
                    b.copy_(part.view(b.shape))
            for _, back in staged:
                back()

        return self._submit("all_reduce_coalesced", job, tensors)

    @_eager
    def reduce(self, tensors, opts=None):
        t = _one(tensors, "reduce")
        red = _reduction(opts, t.dtype, "reduce")
        root = opts.rootRank if opts is not None else 0
        is_root = root == self.rank()
        buf, back = self._working(t)

        def job() -> None:
            # Every rank takes part in a sealed all-reduce; only the root keeps the result.
            work = buf if is_root else buf.clone()
            self._all_reduce(work.view(-1), red)
            if is_root:
                back()

        return self._submit("reduce", job, tensors)

    # -- broadcast -----------------------------------------------------------------------
    @_eager
    def broadcast(self, tensors, opts=None):
        t = _one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        if not 0 <= root < self.size():
            raise ConfigError(f"broadcast: root {root} is not a rank of a group of {self.size()}")
        buf, back = self._working(t)

        def job() -> None:
            if self.domain_links is not None:
                hierarchical_broadcast(self.domain_links, buf.view(-1), root)
            else:
                run_broadcast(self.secure_group, buf.view(-1), root)
            back()

        return self._submit("broadcast", job, tensors)

    # -- all-gather --------------------------------------------------------------------
    def _gather_job(self, outs: list[torch.Tensor], inp: torch.Tensor, what: str) -> Callable[[], None]:
        n = self.size()
        if len(outs) != n:
            raise ConfigError(f"{what}: need {n} output tensors, got {len(outs)}")
        for o in outs:
            _check(o, what)
        dtype = _same_dtype(outs + [inp], what)
        sizes = [o.numel() for o in outs]
        if sizes[self.rank()] != inp.numel():
            raise ConfigError(f"{what}: this rank's output has {sizes[self.rank()]} elements, "
                              f"its input {inp.numel()}")

        bounds = sized_bounds(sizes) if len(set(sizes)) > 1 else None
        src = self._input(inp)
        staged = [self._working(o) for o in outs]

        def job() -> None:
            flat = torch.empty(sum(sizes), dtype=dtype, device=src.device)
            run_all_gather(self.secure_group, flat, src.reshape(-1), bounds)
            for (buf, back), part in zip(staged, flat.split(sizes)):
                buf.copy_(part.view(buf.shape))
                back()

        return job

    @_eager
    def allgather(self, output_tensors, input_tensors, opts=None):
        inp = _one(input_tensors, "all_gather")
        if len(output_tensors) != 1:
            raise ConfigError("all_gather: the ccddp backend takes one output list per call")
        return self._submit("all_gather", self._gather_job(output_tensors[0], inp, "all_gather"), output_tensors,
                            input_tensors)

    @_eager
    def allgather_coalesced(self, output_lists, input_list, opts=None):
        jobs = [self._gather_job([per_rank[i] for per_rank in output_lists], _check(x, "all_gather_coalesced"),
                                 "all_gather_coalesced") for i, x in enumerate(input_list)]
        return self._submit("all_gather_coalesced", lambda: [j() for j in jobs], output_lists, input_list)

    def _gather_flat_job(self, output: torch.Tensor, input: torch.Tensor, what: str) -> Callable[[], None]:
        _check(output, what), _check(input, what)
        if output.numel() != self.size() * input.numel() or output.dtype != input.dtype:
            raise ConfigError(f"{what}: output must hold world_size x input elements of the input's dtype "
                              f"({output.numel()} {output.dtype} vs {self.size()} x {input.numel()} {input.dtype})")
        buf, back = self._working(output)
        src = self._input(input)

        def job() -> None:
            run_all_gather(self.secure_group, buf.view(-1), src.view(-1))
            back()

        return job

    @_eager
    def _allgather_base(self, output, input, opts=None):
        return self._submit("all_gather_into_tensor", self._gather_flat_job(output, input, "all_gather_into_tensor"),
                            [output], [input])

    all_gather_single = _allgather_base

    @_eager
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        jobs = [self._gather_flat_job(o, i, "all_gather_into_tensor_coalesced") for o, i in zip(outputs, inputs)]
        return self._submit("all_gather_into_tensor_coalesced", lambda: [j() for j in jobs], outputs, inputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    # -- reduce-scatter ------------------------------------------------------------------
    def _reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, red: Reduction) -> None:
        """Equal chunks, 1-D contiguous: hierarchical over trust domains, else the flat ring."""
        if self.domain_links is not None:
            hierarchical_reduce_scatter(self.domain_links, out, inp, red)
        else:
            run_reduce_scatter(self.secure_group, out, inp, red)

    @_eager
    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        out = _one(output_tensors, "reduce_scatter")
        red = _reduction(opts, out.dtype, "reduce_scatter")
        if len(input_lists) != 1 or len(input_lists[0]) != self.size():
            raise ConfigError(f"reduce_scatter: need one list of {self.size()} input tensors")
        ins = [_check(x, "reduce_scatter") for x in input_lists[0]]
        _same_dtype(ins + [out], "reduce_scatter")
        sizes = [x.numel() for x in ins]
        if sizes[self.rank()] != out.numel():
            raise ConfigError(f"reduce_scatter: this rank's output has {out.numel()} elements, "
                              f"its input chunk {sizes[self.rank()]}")
        bounds = sized_bounds(sizes) if len(set(sizes)) > 1 else None
        buf, back = self._working(out)
        srcs = [self._input(x) for x in ins]

        def job() -> None:
            flat = torch.cat([x.reshape(-1) for x in srcs])
            if bounds is None:
                self._reduce_scatter(buf.view(-1), flat, red)
            else:
                run_reduce_scatter(self.secure_group, buf.view(-1), flat, red, bounds)
            back()

        return self._submit("reduce_scatter", job, output_tensors, input_lists)

    def _scatter_flat_job(self, output: torch.Tensor, input: torch.Tensor, opts, what: str) -> Callable[[], None]:
        _check(output, what), _check(input, what)
        red = _reduction(opts, output.dtype, what)
        if input.numel() != self.size() * output.numel() or output.dtype != input.dtype:
            raise ConfigError(f"{what}: input must hold world_size x output elements of the output's dtype "
                              f"({input.numel()} {input.dtype} vs {self.size()} x {output.numel()} {output.dtype})")
        buf, back = self._working(output)
        src = self._input(input)

        def job() -> None:
            self._reduce_scatter(buf.view(-1), src.view(-1), red)
            back()

        return job

    @_eager
    def _reduce_scatter_base(self, output, input, opts=None):
        return self._submit("reduce_scatter_tensor",
                            self._scatter_flat_job(output, input, opts, "reduce_scatter_tensor"), [output], [input])

    reduce_scatter_single = _reduce_scatter_base

    @_eager
    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        jobs = [self._scatter_flat_job(o, i, opts, "reduce_scatter_tensor_coalesced") for o, i in zip(outputs, inputs)]
        return self._submit("reduce_scatter_tensor_coalesced", lambda: [j() for j in jobs], outputs, inputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # -- all-to-all, gather, scatter -----------------------------------------------------
    @_eager
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        _check(output, "all_to_all_single"), _check(input, "all_to_all_single")
        n = self.size()
        obuf, back = self._working(output, sealed_there=False)
        outs = _splits(obuf, list(output_split_sizes), n, "all_to_all_single output")
        ins = _splits(self._input(input, sealed_there=False), list(input_split_sizes), n, "all_to_all_single input")

        def job() -> None:
            all_to_all(outs, ins, self.secure_group)
            back()

        return self._submit("all_to_all_single", job, [output], [input])

    all_to_all_single = alltoall_base

    @_eager
    def alltoall(self, output_tensors, input_tensors, opts=None):
        staged = [self._working(_check(o, "all_to_all"), sealed_there=False) for o in output_tensors]
        ins = [self._input(_check(x, "all_to_all"), sealed_there=False) for x in input_tensors]

        def job() -> None:
            all_to_all([b for b, _ in staged], ins, self.secure_group)
            for _, back in staged:
                back()

        return self._submit("all_to_all", job, output_tensors, input_tensors)

    @_eager
    def gather(self, output_lists, input_tensors, opts=None):
        inp = _one(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        if self.rank() == root:
            if len(output_lists) != 1:
                raise ConfigError("gather: the destination rank needs one output list")
            staged = [self._working(_check(o, "gather"), sealed_there=False) for o in output_lists[0]]
        else:
            staged = None
        src = self._input(inp, sealed_there=False)

        def job() -> None:
            gather([b for b, _ in staged] if staged is not None else None, src, root, self.secure_group)
            for _, back in staged or []:
                back()

        return self._submit("gather", job, output_lists, input_tensors)

    @_eager
    def scatter(self, output_tensors, input_lists, opts=None):
        out = _one(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        ins = None
        if self.rank() == root:
            if len(input_lists) != 1:
                raise ConfigError("scatter: the source rank needs one input list")
            ins = [self._input(_check(x, "scatter"), sealed_there=False) for x in input_lists[0]]
        buf, back = self._working(out, sealed_there=False)

        def job() -> None:
            scatter(buf, ins, root, self.secure_group)
            back()

        return self._submit("scatter", job, output_tensors, input_lists)

    # -- barriers --------------------------------------------------------------------------
    @_eager
    def barrier(self, opts=None):
        # A sealed one-element all-reduce: the host cannot fake a peer's arrival, and, queued
        # behind every earlier op of this group, it completes after them.
        return self._submit("barrier", lambda: run_all_reduce(self.secure_group, torch.zeros(1, dtype=torch.int32),
                                                               Reduction.SUM), [])

    @_eager
    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """gloo's ``monitored_barrier``, sealed: every other rank reports to rank 0, which
        names the ranks that did not report within ``timeout`` (the first one, or with
        ``wait_all_ranks`` all of them) in gloo's words, then releases the others. The
        reports are sealed point-to-point messages on a tag of their own, so the host can
        neither fake a rank's arrival nor hide which rank hung."""
        if timeout is None:
            limit = self.settings.timeout_s
        else:
            limit = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        ms = int(limit * 1000)
        n, me = self.size(), self.rank()
        links = self.peer_links
        if me != 0:
            links.isend(torch.ones(1, dtype=torch.int32), 0, _MONITORED_TAG).wait(timedelta(seconds=max(limit, 0.001)))
            try:
                links.irecv(torch.empty(1, dtype=torch.int32), 0, _MONITORED_TAG).wait(
                    timedelta(seconds=max(limit, 0.001)))
            except PeerTimeoutError as e:
                raise PeerTimeoutError(f"Rank {me} successfully reached monitoredBarrier, but received errors while "
                                       f"waiting for send/recv from rank 0. Please check rank 0 logs for faulty "
                                       f"rank. ({e})") from None
            return None
        start = time.monotonic()
        reports = {r: links.irecv(torch.empty(1, dtype=torch.int32), r, _MONITORED_TAG) for r in range(1, n)}
        missing, processed = [], []
        for r, report in reports.items():
            # As gloo: with wait_all_ranks every rank gets the whole timeout (else the first
            # hung rank would use it up and hide the next ones); without, what is left of it.
            remaining = limit if wait_all_ranks else limit - (time.monotonic() - start)
            if remaining < 0:
                done = (f"Successfully processed ranks: {', '.join(map(str, processed))}" if processed
                        else "No ranks successfully processed in monitoredBarrier.")
                raise PeerTimeoutError(f"Rank {me} timed out in monitoredBarrier after {ms} ms. {done}")
            try:
                report.wait(timedelta(seconds=max(remaining, 0.001)))
            except PeerTimeoutError:
                missing.append(r)
                if not wait_all_ranks:
                    raise PeerTimeoutError(f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {ms} ms") from None
            else:
                processed.append(r)
        if missing:
            raise PeerTimeoutError(f"[Rank 0]: Ranks {', '.join(map(str, missing))} failed to pass monitoredBarrier "
                                   f"in {ms} ms")
        for r in range(1, n):
            links.isend(torch.ones(1, dtype=torch.int32), r, _MONITORED_TAG).wait(timedelta(seconds=max(limit, 0.001)))
        return None

    # -- point to point ----------------------------------------------------------------------
    # A device tensor's message is staged: sealed from (opened into) host memory.
    @_eager
    def send(self, tensors, dst_rank, tag=0):
        t = _one(tensors, "send")
        # .cpu(): a copy that waits for the caller's stream to have written t.
        host = t.cpu() if t.device.type == "cuda" else t
        return PeerWork(self.peer_links.isend(host.contiguous(), dst_rank, tag), tensors, "send",
                        devices=_devices(t))

    def _recv(self, tensors, src_rank: int | None, tag: int) -> PeerWork:
        t = _one(tensors, "recv")
        if t.device.type != "cuda":
            return PeerWork(self.peer_links.irecv(t, src_rank, tag), tensors, "recv")
        host = torch.empty(t.shape, dtype=t.dtype)
        pending = self.peer_links.irecv(host, src_rank, tag)
        return PeerWork(pending, tensors, "recv", devices=_devices(t), then=lambda: t.copy_(host))

    @_eager
    def recv(self, tensors, src_rank, tag=0):
        return self._recv(tensors, src_rank, tag)

    @_eager
    def recv_anysource(self, tensors, tag=0):
        return self._recv(tensors, None, tag)

    # -- life -----------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the op queue and the crypto threads (``destroy_process_group`` calls this).
        The internal gloo links go with the process: gloo closes sockets abortively, and a
        peer may still be reading its last frames."""
        self.queue.close()
        if self.secure_group.transport.ordered is not None:
            self.secure_group.transport.ordered.close()
        self.secure_group.close()

    def abort(self) -> None:
        self.shutdown()
