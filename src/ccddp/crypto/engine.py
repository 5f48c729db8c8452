"""Runs crypto jobs on a small thread pool, so segments of a message are sealed and
opened in parallel (multi-chain). ``cryptography``>=50 releases the GIL inside
AES-GCM, so the threads really run at once.

Example::

    with CryptoEngine(chains=2) as eng:
        futs = [eng.submit(job) for job in jobs]
        for f in futs:
            f.result()
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from ccddp.errors import ConfigError


class CryptoEngine:
    def __init__(self, chains: int = 2) -> None:
        if chains < 1:
            raise ConfigError("chains must be >= 1")
        self.chains = chains
        self._pool = ThreadPoolExecutor(max_workers=chains, thread_name_prefix="ccddp-crypto")

    def submit(self, fn: Callable, *args) -> Future:
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "CryptoEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
