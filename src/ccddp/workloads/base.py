"""The :class:`Workload` contract every model of the paper's Table I implements.

A workload bundles a full-size architecture (built from a maintained library, random
init, never downloaded), synthetic data shaped like the original data set, and the loss
of one training step. Everything a run depends on is a constructor setting, and
:attr:`Workload.shapes` records all of it, so a result file says exactly what ran.

Example::

    from ccddp.workloads import get_workload

    wl = get_workload("bert-base", size="tiny", batch_size=2)
    model = wl.build_model()
    batch = wl.make_batch(step=0, rank=0, world_size=2)
    wl.loss(model, batch).backward()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from ccddp.errors import ConfigError
from ccddp.workloads.paper_table import PAPER

#: dtype names accepted by ``dtype=`` overrides and ``--dtype`` options.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

#: Sizes every workload offers: ``default`` runs on a 2-core / 24 GB machine at world
#: size 2, ``tiny`` is the same family and code path shrunk for CI.
SIZES = ("default", "tiny")


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"`` / ``torch.bfloat16`` -> ``torch.bfloat16``; anything else is a
    :class:`~ccddp.errors.ConfigError`."""
    if isinstance(value, torch.dtype):
        if value in DTYPES.values():
            return value
        raise ConfigError(f"unsupported dtype {value}; choose one of: {', '.join(DTYPES)}")
    key = str(value).removeprefix("torch.")
    if key not in DTYPES:
        raise ConfigError(f"unsupported dtype '{value}'; choose one of: {', '.join(DTYPES)}")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def derive_seed(*parts: int) -> int:
    """A 63-bit seed mixing all ``parts``.

    numpy's SeedSequence hashes the whole tuple, so (seed, step, rank) triples that are
    close together still give unrelated streams, unlike ``seed + step + rank``.
    """
    state = np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(2)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def generator(*parts: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with :func:`derive_seed` of ``parts``."""
    g = torch.Generator()
    g.manual_seed(derive_seed(*parts))
    return g


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build modules directly in ``dtype``: a bfloat16 GPT2-XL never exists in fp32,
    which would double its peak memory while it is being created."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


class Workload:
    """One of the paper's seven models, with its synthetic data and loss.

    Subclasses set :attr:`family`, :attr:`PRESETS` (settings per size) and implement
    :meth:`_create_model`, :meth:`make_batch` and :meth:`loss`. Settings not in the
    preset of the chosen size are rejected, so a typo never silently does nothing.

    Attributes:
        name: registry name, e.g. ``"bert-base"``.
        family: ``"graph"``, ``"vision"`` or ``"language"``.
        size: ``"default"`` or ``"tiny"``.
        settings: the resolved settings (preset updated with overrides).
    """

    family: ClassVar[str] = ""
    #: size -> settings; every size must define the same keys.
    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    #: Why the default dtype is below float32, if it is (recorded in shapes).
    DTYPE_REASON: ClassVar[str | None] = None

    def __init__(self, name: str, size: str = "default", **overrides: Any) -> None:
        if size not in self.PRESETS:
            raise ConfigError(f"unknown size '{size}' for workload '{name}'; "
                              f"choose one of: {', '.join(self.PRESETS)}")
        settings = dict(self.PRESETS[size])
        # "same": matmuls in the parameter dtype; a dtype name: upcast them (see
        # ccddp.workloads.precision), for bfloat16 parameters on CPUs without bf16 GEMMs.
        settings.setdefault("matmul_dtype", "same")
        unknown = sorted(set(overrides) - set(settings))
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)} for workload '{name}'; "
                              f"choose from: {', '.join(sorted(settings))}")
        for key, value in overrides.items():
            if value is not None:
                settings[key] = value
        settings["dtype"] = dtype_name(parse_dtype(settings["dtype"]))
        if settings["matmul_dtype"] != "same":
            settings["matmul_dtype"] = dtype_name(parse_dtype(settings["matmul_dtype"]))
        self._dtype_overridden = overrides.get("dtype") is not None
        for key in ("batch_size", "seed"):
            if not isinstance(settings[key], int) or isinstance(settings[key], bool):
                raise ConfigError(f"{key} must be an integer, got {settings[key]!r}")
        if settings["batch_size"] < 1:
            raise ConfigError(f"batch_size must be >= 1, got {settings['batch_size']}")
        self.name = name
        self.size = size
        self.settings = settings
        self._validate()
        self._num_params: int | None = None

    # -- settings ---------------------------------------------------------------

    def _validate(self) -> None:
        """Check family-specific settings; raise ConfigError."""

    @property
    def seed(self) -> int:
        return int(self.settings["seed"])

    @property
    def batch_size(self) -> int:
        """Per-rank batch size (samples, or seed nodes for graphs)."""
        return int(self.settings["batch_size"])

    @property
    def param_dtype(self) -> torch.dtype:
        """dtype of parameters, gradients and DDP buckets."""
        return DTYPES[self.settings["dtype"]]

    @property
    def matmul_dtype(self) -> torch.dtype:
        """dtype the linear layers multiply in (parameters stay :attr:`param_dtype`)."""
        value = self.settings["matmul_dtype"]
        return self.param_dtype if value == "same" else DTYPES[value]

    @property
    def num_params(self) -> int:
        """Number of trainable scalars (shared tensors counted once), from a meta build."""
        if self._num_params is None:
            model = self.build_model(device="meta")
            seen: set[int] = set()
            total = 0
            for p in model.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
            self._num_params = total
        return self._num_params

    @property
    def param_bytes(self) -> int:
        """Bytes of the trainable parameters (as many again for their gradients)."""
        return self.num_params * torch.empty((), dtype=self.param_dtype).element_size()

    @property
    def shapes(self) -> dict[str, Any]:
        """Everything this workload uses, for result files (JSON-serialisable)."""
        reduced = self.param_dtype != torch.float32
        if not reduced:
            reason = None
        elif self._dtype_overridden:
            reason = "requested by the caller"
        else:
            reason = self.DTYPE_REASON
        out: dict[str, Any] = {
            "workload": self.name,
            "family": self.family,
            "size": self.size,
            "paper_batch_size": PAPER[self.name]["batch_size"],
            **{k: (list(v) if isinstance(v, tuple) else v) for k, v in self.settings.items()},
            "num_params": self.num_params,
            "param_bytes": self.param_bytes,
            "dtype_reduced": reduced,
            "dtype_reason": reason,
        }
        return out

    # -- model ------------------------------------------------------------------

    def build_model(self, device: str | torch.device = "cpu") -> torch.nn.Module:
        """The full architecture in training mode, parameters in :attr:`param_dtype`.

        Deterministic: the same seed gives bit-identical parameters, and the global RNG
        is left as it was. ``device="meta"`` allocates nothing (for bucket plans and
        FLOP counts of GPT2-XL in a second).
        """
        device = torch.device(device)
        with torch.random.fork_rng(devices=[]), default_dtype(self.param_dtype), device:
            torch.manual_seed(derive_seed(self.seed, 0x6D6F64656C))  # "model"
            model = self._create_model()
        if self.matmul_dtype != self.param_dtype:
            from ccddp.workloads.precision import upcast_matmuls

            upcast_matmuls(model, self.matmul_dtype)
        model.train()
        return model

    def _create_model(self) -> torch.nn.Module:
        raise NotImplementedError

    # -- data and loss ----------------------------------------------------------

    def make_batch(self, step: int, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
        """Per-rank batch of ``step``: deterministic from (seed, step, rank, world_size).

        Ranks read disjoint shards of one synthetic stream, as with a
        ``DistributedSampler``: rank ``r`` of ``n`` at step ``s`` gets chunk ``s*n + r``.
        """
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Scalar training loss of ``model`` on ``batch`` (training-mode forward)."""
        raise NotImplementedError

    def gradient_ready_order(self) -> list[int]:
        """Indices (into DDP's parameter list) in the order backward produces gradients.

        Traced with one backward of a one-sample batch on the meta device (seconds even
        for GPT2-XL, no memory). This is the order DDP's Reducer records in iteration 0
        and rebuilds its buckets from; see :func:`ccddp.workloads.bucket_plan`.
        """
        probe = type(self)(self.name, self.size, **{**self.settings, "batch_size": 1})
        model = probe.build_model(device="meta")
        _, params, _ = reducer_parameters(model)
        order: list[int] = []
        handles = [p.register_post_accumulate_grad_hook(lambda _p, i=i: order.append(i))
                   for i, p in enumerate(params)]
        try:
            batch = probe.make_batch(0, 0, 1)
            # transformers reads mask values (impossible on meta); a mask never changes
            # which parameters get gradients or in what order.
            batch.pop("attention_mask", None)
            batch = {k: v.to("meta") for k, v in batch.items()}
            with torch.device("meta"):
                probe.loss(model, batch).backward()
        finally:
            for h in handles:
                h.remove()
        # Parameters that got no gradient (none in the seven workloads) go last.
        seen = set(order)
        return order + [i for i in range(len(params)) if i not in seen]

    # -- helpers ----------------------------------------------------------------

    def _chunk_generator(self, step: int, rank: int, world_size: int) -> torch.Generator:
        _check_position(step, rank, world_size)
        return generator(self.seed, 0x64617461, step * world_size + rank)  # "data"

    def __repr__(self) -> str:
        return (f"<Workload {self.name} size={self.size} batch={self.batch_size} "
                f"dtype={self.settings['dtype']}>")


def int_setting(settings: dict[str, Any], key: str, low: int, high: int | None = None) -> int:
    """``settings[key]`` as an int in ``[low, high]`` (stored back), else ConfigError."""
    value = settings[key]
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
        raise ConfigError(f"{key} must be a non-negative integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ConfigError(f"{key} must be {'in ' if high is not None else ''}{bound}, got {value}")
    settings[key] = value
    return value


def _check_position(step: int, rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in [0, {world_size}), got {rank}")
    if step < 0:
        raise ConfigError(f"step must be >= 0, got {step}")


def reducer_parameters(model: torch.nn.Module) -> tuple[list[str], list[torch.Tensor], list[bool]]:
    """(names, parameters, expect_sparse_gradient) in DDP's order (``_build_params_for_reducer``)."""
    names: list[str] = []
    params: list[torch.Tensor] = []
    sparse: list[bool] = []
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            names.append(f"{module_name}.{param_name}" if module_name else param_name)
            params.append(param)
            sparse.append(isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag))
                          and bool(module.sparse))
    return names, params, sparse
