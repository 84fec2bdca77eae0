"""Seeded random streams: every random choice is keyed by (seed, purpose, sample index, ...), never by order.

That is what makes the output independent of worker count and rank split, and what lets a fault leave every
other member untouched: each member draws from its own stream, fault placement and fault payloads from others.
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["fault_rng", "member_rng", "pool_rng", "sample_rng"]

# Stream namespaces (the first element of a SeedSequence spawn key).
_STREAM_MEMBER = 1
_STREAM_FAULT = 2
_STREAM_POOL = 3
_STREAM_SAMPLE = 4


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


def member_rng(seed: int, index: int, member: str) -> np.random.Generator:
    """The stream for one member of one sample (keyed by name, so adding a member changes no other)."""
    return _rng(seed, _STREAM_MEMBER, index, zlib.crc32(member.encode("utf-8")))


def sample_rng(seed: int, index: int) -> np.random.Generator:
    """The stream for per-sample choices (the resolution bucket)."""
    return _rng(seed, _STREAM_SAMPLE, index)


def fault_rng(seed: int, *key: int) -> np.random.Generator:
    """The streams for fault placement and fault payloads, disjoint from every content stream."""
    return _rng(seed, _STREAM_FAULT, *key)


def pool_rng(seed: int, size: int) -> np.random.Generator:
    """The stream of the standard-normal pool tensors are cut from."""
    return _rng(seed, _STREAM_POOL, size)
