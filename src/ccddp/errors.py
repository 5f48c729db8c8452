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
            print(e.link, e.collective, e.step)
    """

    def __init__(self, message: str, *, link: str = "?", collective: str = "?",
                 step: int | str = "?") -> None:
        super().__init__(f"{message} (link {link}, collective {collective}, step {step})")
        self.link = link
        self.collective = collective
        self.step = step


class FrameFormatError(IntegrityError):
    """A frame has the wrong size or shape to be opened at all (e.g. truncated)."""


class PeerTimeoutError(CCDDPError):
    """A peer did not answer within the configured timeout."""
