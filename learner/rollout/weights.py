"""Version-tagged weight publishing through shared memory (one node).

The learner copies its parameters into tensors that live in shared memory and bumps the
version; rollout workers copy them into their engine when they need that version. A
seqlock-style pair of counters (``writing``/``version``) lets a reader detect that it
copied while a write was in progress and retry, so no reader ever runs a torn mix of two
versions.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Mapping

import torch


class WeightStore:
    def __init__(self, named_params: Mapping[str, torch.Tensor], ctx=None, counters=None):
        """``counters``: the (version, writing) ``multiprocessing.Value`` pair, when readers were
        spawned before the store existed (``learner.rollout.boot``); made here otherwise."""
        ctx = ctx or mp.get_context("spawn")
        # fp32 wire format: engines cast on load; keeps bf16 learners compatible with fp32 engines
        tensors = {n: t.detach().to(torch.float32).clone().share_memory_() for n, t in named_params.items()}
        # writing == version while stable, version+1 during a write
        self._init(tensors, *(counters or (ctx.Value("q", 0), ctx.Value("q", 0))))

    def _init(self, tensors: dict[str, torch.Tensor], version, writing) -> None:
        self.tensors, self._version, self._writing = tensors, version, writing
        self.nbytes = sum(t.numel() * t.element_size() for t in self.tensors.values())

    @classmethod
    def attach(cls, tensors: dict[str, torch.Tensor], version, writing) -> "WeightStore":
        """A reader's view: the shared tensors (received through a queue) and the counters
        (inherited at spawn)."""
        store = cls.__new__(cls)
        store._init(tensors, version, writing)
        return store

    @property
    def version(self) -> int:
        return self._version.value

    def publish(self, named_params: Mapping[str, torch.Tensor], version: int) -> None:
        with torch.no_grad():
            self._writing.value = version
            for n, t in named_params.items():
                self.tensors[n].copy_(t.detach())
            self._version.value = version

    def read_into(self, load, want: int | None = None, timeout_s: float = 120.0) -> int:
        """Call ``load(tensors, version)`` with a consistent snapshot; returns its version.

        ``want``: wait until at least that version is published (None: the latest).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            v = self._version.value
            if (want is None or v >= want) and self._writing.value == v:
                load(self.tensors, v)
                if self._writing.value == v and self._version.value == v:
                    return v
            if time.monotonic() > deadline:
                raise TimeoutError(f"weights version {want} not published within {timeout_s:.0f}s (have {v})")
            time.sleep(0.001)
