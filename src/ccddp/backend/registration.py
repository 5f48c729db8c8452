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
    / ``CCDDP_ATTESTATION_POLICY`` or the pre-shared ``CCDDP_GROUP_SECRET``),
    ``establishment`` (a :class:`ccddp.crypto.establish.KeyEstablishment`, e.g. with a
    hardware-attestation verifier; not with ``secret``).

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
    establishment: object = None

    def key_source(self, settings):
        """Where the group's keys come from (``ccddp.comm.session.establish``): ``secret`` or
        ``establishment``, else what the environment names for ``settings``."""
        from ccddp.comm.session import key_source_from_env
        from ccddp.errors import ConfigError

        if self.secret is not None and self.establishment is not None:
            raise ConfigError("pass either a pre-shared secret or an establishment, not both")
        if self.secret is not None:
            return self.secret
        return self.establishment if self.establishment is not None else key_source_from_env(settings)


def _torch_default_timeout_s() -> float:
    from torch.distributed.constants import default_pg_timeout

    return default_pg_timeout.total_seconds()


def settings_from_env(timeout_s: float | None = None):
    """The ``CommSettings`` that ``CCDDP_SETTINGS`` asks for (defaults if unset), with the
    group's ``timeout_s``: a timeout the group was given wins over the variable's
    ``timeout_s`` (with a warning when they differ); the variable's applies to a group
    made with torch's default timeout (see :class:`Options`)."""
    from ccddp.comm.settings import settings_from_json

    text = os.environ.get(SETTINGS_ENV, "")
    # Bounded and typed before anything is read from it: a violation is one ConfigError
    # that names the field (the variable is set by whoever started the process).
    settings = settings_from_json(text)
    if timeout_s is None:
        return settings
    named = json.loads(text).get("timeout_s") if text.strip() else None   # checked above
    if named is None or timeout_s != _torch_default_timeout_s():
        if named is not None and named != timeout_s:
            warnings.warn(f"{SETTINGS_ENV} names timeout_s={named!r}, but this group was created with "
                          f"timeout={timeout_s:g}s: the group's own timeout is used", stacklevel=3)
        return settings.with_(timeout_s=timeout_s)
    return settings


def _create(backend_opts, options):
    """torch's creator hook (extended API): one ccddp process group."""
    from ccddp.backend import policy, torch_private
    from ccddp.backend.process_group import ProcessGroupCCDDP
    from ccddp.errors import CCDDPError, ConfigError

    try:
        torch_private.require()  # a torch outside the range, or one that moved a hook: one line, no group
        policy.install()  # from now on, a gloo group under a ccddp default group is ccddp too
        if options is not None and not isinstance(options, Options):
            raise ConfigError(f"pg_options for the ccddp backend must be ccddp.backend.Options, "
                              f"got {type(options).__name__}")
        if options is None or (options.secret is None and options.establishment is None):
            require_key_material(backend_opts.group_rank)
        ranks = list(backend_opts.global_ranks_in_group) or list(range(backend_opts.group_size))  # [] = the world
        return ProcessGroupCCDDP(backend_opts.store, backend_opts.group_rank, backend_opts.group_size,
                                 backend_opts.timeout, options or Options(), group_id=str(backend_opts.group_id),
                                 global_ranks=ranks)
    except CCDDPError:
        # A group that cannot be made (a bad setting, no or other key material, a refused
        # peer) is said in one line per rank, as the README promises: its message is the
        # whole story, a traceback through torch's group creation adds nothing.
        one_line_errors()
        raise


def missing_key_material() -> bool:
    """Whether this process has no key material at all: no ``CCDDP_IDENTITY`` or
    ``CCDDP_ATTESTATION_POLICY`` (key establishment), no group secret taken from
    ``CCDDP_GROUP_SECRET`` and no ``CCDDP_GROUP_SECRET_FILE``. (A malformed or weak secret
    is not "missing": reading it raises its own error.)"""
    from ccddp.crypto import keys
    from ccddp.crypto.establish import ENV_ATTESTATION_POLICY, ENV_IDENTITY

    if any(os.environ.get(v) for v in (ENV_IDENTITY, ENV_ATTESTATION_POLICY, keys.ENV_SECRET_FILE)):
        return False
    keys.take_secret_from_env()
    return keys._taken is None


def require_key_material(rank: int) -> None:
    """A ccddp group with no key material stops at once, before any link is set up, with
    one line per rank that says how to give it one (an uncaught error prints just that
    line: :func:`one_line_errors`)."""
    if not missing_key_material():
        return
    from ccddp.crypto.keys import ENV_SECRET, ENV_SECRET_FILE
    from ccddp.errors import ConfigError

    raise ConfigError(f"rank {os.environ.get('RANK', rank)}: no key material for the ccddp backend: start the script "
                      f"with `ccddp launch` in place of torchrun (one node: it makes a group secret), or set "
                      f"{ENV_SECRET} (64 hex digits, the same on every rank) or {ENV_SECRET_FILE} on every rank")


def one_line_errors() -> None:
    """From now on, a ccddp error nobody catches ends this process with one line
    (``ccddp: error: ...``) instead of a traceback; every other exception keeps Python's
    own report. The error still propagates, so a script can catch it."""
    import sys

    previous = sys.excepthook
    if getattr(previous, "ccddp_one_line", False):
        return

    def hook(kind, value, tb):
        from ccddp.errors import CCDDPError

        if isinstance(value, CCDDPError):
            print(f"ccddp: error: {value}", file=sys.stderr, flush=True)
        else:
            previous(kind, value, tb)

    hook.ccddp_one_line = True
    sys.excepthook = hook


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
