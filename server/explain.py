"""Where a request's prompt came from, and why not more of it.

The engine reports the reuse (source, slot, restored checkpoint) and, for the candidate that
shared the longest prefix, the first token where it and the new prompt differ with the text
around it: the prompt's own text, and the candidate's only where it is the reply to a prompt
the new one contains whole (never another conversation's text). This module places that token in the conversation (which message, which role) and
words it three ways: the `X-Warmslot-Cache` header, the opt-in `warmslot` body field, and one
log line per request; the admin's list of recent requests gets it without the text.
"""

from __future__ import annotations

import enum

from typing import Any

from warmslot.slots import Reuse, Usage

from .prompt.builder import Prompt


def divergence(reuse: Reuse, n_prompt: int, prompt: Prompt | None) -> dict[str, Any] | None:
    """Where the best candidate and the prompt first differ; None when nothing differs (the
    candidate is a prefix of the prompt, or there was no candidate)."""
    if not reuse.candidate_len or reuse.matched >= min(reuse.candidate_len, n_prompt):
        return None
    at = reuse.matched
    out: dict[str, Any] = {"token": at}
    if prompt is not None:
        index = prompt.message_at(at)
        if index >= 0:
            out["message"] = index
            out["role"] = prompt.messages[index][0]
    out["context"] = reuse.context_text
    out["old"] = reuse.old_text if reuse.old_quoted else None  # another prompt's text: never
    out["new"] = reuse.new_text
    return out


def explanation(reuse: Reuse | None, n_prompt: int, prompt: Prompt | None) -> dict[str, Any]:
    if reuse is None:
        return {}
    return {
        "source": reuse.source,
        "slot": reuse.slot,
        "prompt_tokens": n_prompt,
        "cached_tokens": reuse.cached,
        "matched_tokens": reuse.matched,
        "candidate": reuse.candidate_source,
        "restored_checkpoint": reuse.restored_checkpoint,
        "reused_logits": reuse.used_logits,
        **({"shifted_tokens": reuse.shifted} if reuse.shifted is not None else {}),
        "divergence": divergence(reuse, n_prompt, prompt),
        "reason": reuse.reason,
        "state_bytes": {"device_to_ram": reuse.state_bytes.get("device_to_ram", 0),
                        "ram_to_device": reuse.state_bytes.get("ram_to_device", 0),
                        "disk_to_ram": reuse.state_bytes.get("disk_to_ram", 0)},
    }


def redacted(reuse: Reuse | None, n_prompt: int, prompt: Prompt | None) -> dict[str, Any]:
    """The explanation without any text: the positions and counts, for a view of every
    tenant's requests (the admin's), as /slots shows other tenants' slots by hash only."""
    out = explanation(reuse, n_prompt, prompt)
    where = out.get("divergence")
    if where is not None:
        out["divergence"] = {k: v for k, v in where.items() if k in ("token", "message", "role")}
    return out


def header(reuse: Reuse | None, n_prompt: int, prompt: Prompt | None) -> dict[str, str]:
    if reuse is None:
        return {}
    parts = [f"source={_name(reuse.source)}", f"cached={reuse.cached}", f"prompt={n_prompt}", f"slot={reuse.slot}"]
    if reuse.restored_checkpoint is not None:
        parts.append(f"checkpoint={reuse.restored_checkpoint}")
    where = divergence(reuse, n_prompt, prompt)
    if where is not None:
        parts.append(f"diverged={where['token']}")
        if "message" in where:
            parts.append(f"message={where['message']}")
    return {"X-Warmslot-Cache": "; ".join(parts)}


def log_line(endpoint: str, reuse: Reuse | None, usage: Usage, prompt: Prompt | None, built_s: float | None = None) -> str:
    """One line per request: slot, cached and computed tokens, timings (`built_s`: the prompt's
    building, from its arrival), and any divergence."""
    if reuse is None:
        return f"{endpoint}: prompt {usage.prompt_tokens}"
    computed = usage.prompt_tokens - usage.cached_tokens
    rate = (usage.completion_tokens - 1) / usage.decode_s if usage.decode_s > 0 and usage.completion_tokens > 1 else 0.0
    line = (
        f"slot {reuse.slot} {endpoint}: prompt {usage.prompt_tokens} = {usage.cached_tokens} cached ({_name(reuse.source)}) "
        f"+ {computed} computed, ttft {usage.ttft_s * 1000:.0f} ms, {usage.completion_tokens} tokens at {rate:.1f}/s"
    )
    if built_s is not None:
        line += f", prompt built in {built_s * 1000:.0f} ms"
    if reuse.restored_checkpoint is not None:
        line += f", restored checkpoint {reuse.restored_checkpoint}"
    if reuse.shifted:
        line += f", {reuse.shifted} of the cached tokens from shifted chunks (approximate)"
    if reuse.state_bytes:
        moved = [f"{n / 1e6:.1f} MB {way.replace('_', ' ')}" for way, n in sorted(reuse.state_bytes.items())]
        line += ", state copied " + " and ".join(moved)
    if usage.draft_tokens:
        line += (
            f", drafted {usage.draft_tokens} accepted {usage.draft_accepted} "
            f"({usage.draft_accepted / usage.draft_tokens:.0%})"
        )
    where = divergence(reuse, usage.prompt_tokens, prompt)
    if where is not None:
        place = f" in message {where['message']} ({where['role']})" if "message" in where else ""
        old = repr(where["old"]) if where["old"] is not None else "(another prompt's text)"
        line += f"; diverged at token {where['token']}{place}: {old} -> {where['new']!r}"
    if reuse.reason:
        line += f"; {reuse.reason}"
    return line


def _name(value: Any) -> str:
    """An enum's value ("ram"), as docs/metrics.md names sources; f"{...}" of a str enum writes
    "Source.RAM" on some Python versions."""
    return str(value.value) if isinstance(value, enum.Enum) else str(value)
