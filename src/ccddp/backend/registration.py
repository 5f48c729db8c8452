"""Registers ``ccddp`` as a torch.distributed backend.

``register()`` is what ``import ccddp.backend`` (and ``import ccddp`` once torch is loaded)
runs; :func:`autoload` is the ``torch.backends`` entry point, through which torch registers
ccddp at ``import torch`` in any environment where ccddp is installed. Both only register a
name and a creator: nothing heavy is imported until a group is created.

Example::

    import ccddp, torch.distributed as dist
    dist.init_process_group("ccddp")          # or "cpu:ccddp,cuda:ccddp"; launched by torchrun
    sub = dist.new_group([0, 1], backend="ccddp")
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass

BACKEND_NAME = "ccddp"
SETTINGS_ENV = "CCDDP_SETTINGS"


@dataclass(frozen=True)
class Options:
    """Per-group options, passed as ``pg_options=`` to ``init_process_group``/``new_group``.

    ``settings`` (a :class:`ccddp.comm.CommSettings`, secure impls only; default: from
    ``CCDDP_SETTINGS``, a JSON object of its fields, else the defaults), ``secret`` (a
    :class:`ccddp.crypto.GroupSecret`; default: key establishment from ``CCDDP_IDENTITY``
    or the pre-shared ``CCDDP_GROUP_SECRET``).

    The wait limit of every peer wait (``timeout_s``) is the group's ``timeout=`` when
    the group was given one; ``timeout_s`` in ``CCDDP_SETTINGS`` applies only to groups
    made with torch's default timeout (30 min), and where both are given and differ the
    group's wins, with a warning (a process-wide variable must not silently lengthen or
    shorten what one call asked for). ``settings`` given here are used as they are.

    Example::

        dist.new_group(backend="ccddp", pg_options=Options(settings=CommSettings(segment_bytes=1 << 20)))
    """

    settings: object = None
    secret: object = None


def _torch_default_timeout_s() -> float:
    from torch.distributed.constants import default_pg_timeout

    return default_pg_timeout.total_seconds()


def settings_from_env(timeout_s: float | None = None):
    """The ``CommSettings`` that ``CCDDP_SETTINGS`` asks for (defaults if unset), with the
    group's ``timeout_s``: a timeout the group was given wins over the variable's
    ``timeout_s`` (with a warning when they differ); the variable's applies to a group
    made with torch's default timeout (see :class:`Options`)."""
    from ccddp.comm import CommSettings
    from ccddp.errors import ConfigError

    text = os.environ.get(SETTINGS_ENV, "").strip()
    try:
        fields = json.loads(text) if text else {}
        if not isinstance(fields, dict):
            raise ValueError("not a JSON object")
        if timeout_s is not None:
            named = fields.get("timeout_s")
            if named is None or timeout_s != _torch_default_timeout_s():
                if named is not None and named != timeout_s:
                    warnings.warn(f"{SETTINGS_ENV} names timeout_s={named!r}, but this group was created with "
                                  f"timeout={timeout_s:g}s: the group's own timeout is used", stacklevel=3)
                fields["timeout_s"] = timeout_s
        return CommSettings(**fields)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{SETTINGS_ENV} must be a JSON object of collective settings: {e}") from None


def _create(backend_opts, options):
    """torch's creator hook (extended API): one ccddp process group."""
    from ccddp.backend import policy, torch_private
    from ccddp.backend.process_group import ProcessGroupCCDDP

    torch_private.require()  # a torch outside the range, or one that moved a hook: one line, no group
    policy.install()  # from now on, a gloo group under a ccddp default group is ccddp too

    if options is not None and not isinstance(options, Options):
        from ccddp.errors import ConfigError

        raise ConfigError(f"pg_options for the ccddp backend must be ccddp.backend.Options, got {type(options).__name__}")
    ranks = list(backend_opts.global_ranks_in_group) or list(range(backend_opts.group_size))  # [] = the world
    return ProcessGroupCCDDP(backend_opts.store, backend_opts.group_rank, backend_opts.group_size,
                             backend_opts.timeout, options or Options(), group_id=str(backend_opts.group_id),
                             global_ranks=ranks)


def register() -> None:
    """Make ``"ccddp"`` a torch.distributed backend name (idempotent)."""
    import torch.distributed as dist

    if BACKEND_NAME in dist.Backend.backend_list:
        return
    # One process group serves both devices (see docs/design.md, "CUDA tensors"): one op
    # order, one session and one set of links per group, whatever the tensors' device.
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


def autoload() -> None:
    """Entry point of the ``torch.backends`` group: torch calls it at ``import torch``."""
    register()
