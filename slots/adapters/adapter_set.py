"""The LoRA adapters a request runs under, and the cache scope they give its state.

A sequence's KV state depends on the adapters it was computed under, so a prefix computed
under one set must never serve a request under another. The engine keeps one namespace per
tenant already (the slots, the prompt cache's tries, the disk tier's entries are all looked
up by it); a request's *scope* is that namespace: its tenant alone without adapters (so
nothing changes for a server without them, nor for the disk tier's files), else its tenant
and its adapter set. `tenant_of` gives the tenant back, for what shows a tenant its own
slots and entries.

The set names each adapter by a digest of its file (`AdapterInfo.digest`), not only by its
id: the disk tier outlives the process, and a restart may load other files under the same ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

SCOPE_SEPARATOR = "\x1f"  # between the tenant and the adapter set in a scope (never in a key or salt)

__all__ = ["AdapterInfo", "AdapterSet", "NO_ADAPTERS", "scope_of", "tenant_of"]


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """One adapter as loaded: its id (its place on the command line), its file, what its
    metadata says, and a digest that names the file in cache scopes."""

    id: int
    path: str
    digest: str
    task_name: str = ""
    prompt_prefix: str = ""
    invocation_tokens: tuple[int, ...] = ()  # an activated LoRA's (aLoRA); () for a plain one


@dataclass(frozen=True, slots=True)
class AdapterSet:
    """The adapters applied to a request: (id, scale) of each adapter whose scale is not 0,
    by id, and the digests of those adapters in the same order. Equal sets may share a
    decode and cached state; an empty set is the base model."""

    scales: tuple[tuple[int, float], ...] = ()
    digests: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        ids = [i for i, _ in self.scales]
        assert ids == sorted(set(ids)), "one entry per adapter, by id"
        assert all(s != 0.0 for _, s in self.scales), "an adapter at scale 0 is not in the set"
        assert len(self.digests) == len(self.scales)

    @classmethod
    def of(cls, scales: Mapping[int, float], adapters: Sequence[AdapterInfo]) -> "AdapterSet":
        """The set of `scales` (id -> scale; ids of `adapters`), zeros left out."""
        kept = sorted((i, float(s)) for i, s in scales.items() if s != 0.0)
        return cls(tuple(kept), tuple(adapters[i].digest for i, _ in kept))

    def __bool__(self) -> bool:
        return bool(self.scales)

    @property
    def key(self) -> str:
        """The set as a scope names it: each adapter's digest and scale."""
        return ",".join(f"{d}*{s!r}" for d, (_, s) in zip(self.digests, self.scales))

    def describe(self) -> str:
        """For logs: "0*1.0,2*0.5", or "none"."""
        return ",".join(f"{i}*{s:g}" for i, s in self.scales) or "none"


NO_ADAPTERS = AdapterSet()


def scope_of(tenant: str, adapters: AdapterSet) -> str:
    """The namespace a request's cached state lives in (see the module)."""
    return f"{tenant}{SCOPE_SEPARATOR}lora:{adapters.key}" if adapters else tenant


def tenant_of(scope: str) -> str:
    """The tenant of a scope."""
    return scope.split(SCOPE_SEPARATOR, 1)[0]
