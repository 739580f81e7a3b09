"""A miss explained by LoRA adapters: the prompt's prefix is on the device or in the prompt
cache, but under another adapter set than the request's.

Cached state is kept per scope (the tenant and its adapter set: adapters/adapter_set.py), so
the router never offers it; this says, for the miss explanation, that it was there. Read-only.
"""

from __future__ import annotations

from typing import Sequence

from warmslot.cache.prefix_trie import common_prefix
from warmslot.cache.prompt_cache import PromptCache

from ..adapters.adapter_set import tenant_of
from ..requests import GenerateRequest
from ..slot import Slot

__all__ = ["held_under_other_adapters", "other_adapters_reason"]


def held_under_other_adapters(req: GenerateRequest, slots: Sequence[Slot], cache: PromptCache | None) -> int:
    """The longest prefix of `req`'s prompt that a slot or a prompt-cache entry of its tenant
    holds under another adapter set (0: none). Costs a pass over the cache's entries."""
    scope, tenant = req.scope, req.tenant
    holders = [s.tokens for s in slots if s.tokens and s.tenant != scope and tenant_of(s.tenant) == tenant]
    if cache is not None:
        holders += [e.tokens for e in cache.entries() if e.tenant != scope and tenant_of(e.tenant) == tenant]
    return max((common_prefix(tokens, req.tokens) for tokens in holders), default=0)


def other_adapters_reason(n: int) -> str:
    return f"{n} tokens of this prompt are held under other LoRA adapters (state computed under one adapter set never serves another)"
