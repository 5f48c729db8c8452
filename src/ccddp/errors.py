"""Typed errors shared by every layer.

One exception type per failure, in the spirit of ``cryptography``'s ``InvalidTag``:
callers catch what they can handle and the CLI turns any :class:`CCDDPError` into a
one-line message instead of a traceback.
"""

from __future__ import annotations


class CCDDPError(Exception):
    """Base class of every error ccddp raises on purpose."""


class ConfigError(CCDDPError):
    """Settings are invalid, or differ between ranks that must agree."""


class IntegrityError(CCDDPError):
    """A frame failed AES-GCM verification: tampered, replayed, reordered, dropped,
    truncated, spliced, or sealed under another key.

    The unverified plaintext is discarded; it is never reduced into a returned result.

    Example::

        try:
            ring_allreduce(t, comm)
        except IntegrityError as e:
            print(e.link, e.collective, e.step, e.segment)

    ``segment`` is the index of the failed frame within its step's message (a segment of
    the pipelined schedule, or a frame of a message larger than one AES-GCM call takes;
    0 for a one-frame message), ``None`` where the frame is not part of a collective.
    """

    def __init__(self, message: str, *, link: str = "?", collective: str = "?",
                 step: int | str = "?", segment: int | None = None) -> None:
        where = f"link {link}, collective {collective}, step {step}"
        if segment is not None:
            where += f", segment {segment}"
        super().__init__(f"{message} ({where})")
        self.link = link
        self.collective = collective
        self.step = step
        self.segment = segment


class FrameFormatError(IntegrityError):
    """A frame has the wrong size or shape to be opened at all (e.g. truncated)."""


class PeerTimeoutError(CCDDPError):
    """A peer did not answer within the configured timeout."""


_MAX_REASON = 300


def one_line(text: str) -> str:
    """``text`` as one printable line of at most 300 characters: what a rank may print of a
    reason that came from a peer over the untrusted network (no control characters, no
    terminal escapes, no log-line forgery)."""
    clean = "".join(ch if ch.isprintable() else " " for ch in text)
    return " ".join(clean.split())[:_MAX_REASON]
