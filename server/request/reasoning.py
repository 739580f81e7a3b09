"""`--reasoning-format` and `--reasoning-budget`, as llama-server defines them.

- auto (the default): a leading ``<think>...</think>`` block goes to `reasoning_content` when
  the chat template uses think blocks;
- deepseek: it always does, whatever the template;
- none: thoughts stay in `content`.

The budget applies wherever think blocks do (the template uses them, or deepseek), whichever
field the thoughts go to: after N tokens of thinking `</think>` is forced.
"""

from __future__ import annotations

from warmslot.slots import ReasoningBudget, Vocab

from ..prompt.template import detect_reasoning
from ..errors import InvalidRequest
from ..output.markers import THINK_CLOSE, THINK_OPEN


def reasoning_mode(fmt: str, template_source: str | None) -> tuple[bool, bool]:
    """(split thoughts into reasoning_content, the generation prompt opens a think block)."""
    uses, opens = detect_reasoning(template_source)
    if fmt == "none":
        return False, False
    if fmt == "deepseek":
        return True, opens
    return uses, opens


def thinking_default(reasoning: str, template_source: str | None) -> tuple[tuple[str, bool], ...]:
    """The template's `enable_thinking` for --reasoning (a request's chat_template_kwargs
    override it): on or off say so; auto turns thinking on where the template has the switch,
    as llama-server does, and leaves other templates alone."""
    if reasoning == "on" or (reasoning == "auto" and "enable_thinking" in (template_source or "")):
        return (("enable_thinking", True),)
    if reasoning == "off":
        return (("enable_thinking", False),)
    return ()


def thinks(fmt: str, template_source: str | None) -> bool:
    """Whether replies may think: the template uses think blocks, or deepseek says so."""
    return fmt == "deepseek" or detect_reasoning(template_source)[0]


def budget_spec(budget: int, vocab: Vocab, opened: bool) -> ReasoningBudget | None:
    """The budget of one request (None: no limit). `opened`: the prompt ends inside a think
    block, so the reply starts thinking."""
    if budget < 0:
        return None
    start = tuple(vocab.tokenize(THINK_OPEN, add_special=False, parse_special=True))
    end = tuple(vocab.tokenize(THINK_CLOSE, add_special=False, parse_special=True))
    return ReasoningBudget(start=start, end=end, forced=end, budget=budget, inside=opened)


def request_budget(body: dict, default: int) -> int:
    """A request's `reasoning_budget_tokens` (or `thinking_budget_tokens`), as llama-server
    reads them: -1 or absent keeps the server's --reasoning-budget."""
    for name in ("reasoning_budget_tokens", "thinking_budget_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not -1 <= value <= 2**31 - 1:
            raise InvalidRequest(f"'{name}' must be an integer, -1 (the server's budget) or more", param=name)
        return default if value == -1 else value
    return default
