"""Typed errors shared by every layer.

One exception type per failure, in the spirit of ``cryptography``'s ``InvalidTag``:
callers catch what they can handle and the CLI turns any :class:`CCDDPError` into a
one-line message instead of a traceback.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass


class CCDDPError(Exception):
    """Base class of every error ccddp raises on purpose."""


class ConfigError(CCDDPError):
    """Settings are invalid, or differ between ranks that must agree."""



class EstablishmentError(CCDDPError):
    """Key establishment failed: a peer's identity is not trusted, a signature does not
    verify, or ranks saw different exchanges. Raised on every rank of the group.

    (Defined here, beside the rest of the family, so that :class:`AttestationError` can
    subclass it; :mod:`ccddp.crypto.establish` re-exports it under the same name.)"""


class AttestationError(EstablishmentError):
    """Hardware evidence was refused: malformed, not signed by a trusted chain, not bound
    to this run's key exchange, or outside the user's policy.

    ``claim`` names what failed, as a dotted path a test or an operator can match on
    (``"report.signature"``, ``"certs.ask"``, ``"report_data"``, ``"policy.debug"``,
    ``"tcb.microcode"``, ``"measurement"``, ...).

    Example::

        try:
            verify_snp(report, trust, policy, expected_report_data=binding)
        except AttestationError as e:
            print(e.claim)      # "measurement"
    """

    def __init__(self, message: str, *, claim: str = "?") -> None:
        self.claim = claim
        super().__init__(message)


@dataclass(frozen=True)
class FrameLabel:
    """Which frame a failure or a wait is about: the directed ``link`` (``"0->1"``), the
    ``collective`` (``"all_reduce#3"``; ``"descriptor#3"`` for its sealed descriptor),
    the ``step`` of its schedule and the frame's ``segment`` within that step's message
    (``None`` where not known or not applicable).

    A receiver waits on a frame under the same label that an :class:`IntegrityError`
    for that frame carries, so a test can compare the two as data.

    Example::

        FrameLabel("0->1", "all_reduce#3", step=1, segment=2)
        str(_)     # "link 0->1, collective all_reduce#3, step 1, segment 2"
    """

    link: str = "?"
    collective: str = "?"
    step: int | None = None
    segment: int | None = None

    def __str__(self) -> str:
        where = f"link {self.link}, collective {self.collective}, step {'?' if self.step is None else self.step}"
        return where if self.segment is None else f"{where}, segment {self.segment}"

    def as_dict(self) -> dict:
        return asdict(self)


class IntegrityError(CCDDPError):
    """A frame failed AES-GCM verification: tampered, replayed, reordered, dropped,
    truncated, spliced, or sealed under another key.

    The unverified plaintext is discarded; it is never reduced into a returned result.
    ``label`` (a :class:`FrameLabel`) says which frame; ``link``, ``collective``,
    ``step`` and ``segment`` are its fields.

    Example::

        try:
            ring_allreduce(t, comm)
        except IntegrityError as e:
            print(e.label.link, e.label.collective, e.label.step, e.label.segment)

    ``segment`` is the index of the failed frame within its step's message (a segment of
    the pipelined schedule, or a frame of a message larger than one AES-GCM call takes;
    0 for a one-frame message), ``None`` where the frame is not part of a collective.
    """

    def __init__(self, message: str, *, link: str = "?", collective: str = "?",
                 step: int | None = None, segment: int | None = None) -> None:
        self.label = FrameLabel(link, collective, step, segment)
        super().__init__(f"{message} ({self.label})")

    @property
    def link(self) -> str:
        return self.label.link

    @property
    def collective(self) -> str:
        return self.label.collective

    @property
    def step(self) -> int | None:
        return self.label.step

    @property
    def segment(self) -> int | None:
        return self.label.segment


class FrameFormatError(IntegrityError):
    """A frame has the wrong size or shape to be opened at all (e.g. truncated)."""


# torch's own tests (and users' handlers) recognise a collective's timeout by this pattern.
_TORCH_TIMEOUT_WORDING = re.compile(" (Timed out|closed|timeout) ")


class PeerTimeoutError(CCDDPError, RuntimeError):
    """A peer did not answer within the configured timeout. ``label`` is the frame the
    rank was waiting on (a :class:`FrameLabel`), or ``None`` outside a collective.

    It is a ``RuntimeError``, as gloo's timeouts are (torch 2.11 to 2.15 raise a plain
    ``RuntimeError`` "... Timed out waiting 1500ms for recv operation to complete"), and its
    text carries " Timed out ", so handlers and tests written for gloo catch it."""

    def __init__(self, message: str, *, label: FrameLabel | None = None) -> None:
        if not _TORCH_TIMEOUT_WORDING.search(message):
            message = f"{message} (ccddp: Timed out waiting on a peer)"
        super().__init__(message)
        self.label = label


_MAX_REASON = 300


def one_line(text: str) -> str:
    """``text`` as one printable line of at most 300 characters: what a rank may print of a
    reason that came from a peer over the untrusted network (no control characters, no
    terminal escapes, no log-line forgery)."""
    clean = "".join(ch if ch.isprintable() else " " for ch in text)
    return " ".join(clean.split())[:_MAX_REASON]
