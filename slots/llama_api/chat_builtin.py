"""llama.cpp's built-in chat formats: the templates it knows by name (`command-r`, `llama2`,
`phi3`, ...) and renders in C++ (`llama_chat_apply_template`), as llama-server does for
`--chat-template NAME`. Pure functions of their arguments: any thread may call them."""

from __future__ import annotations

import llama_cpp  # noqa: I001  (must precede numpy, see the package docstring)

import ctypes
import functools
from typing import Sequence


@functools.cache
def builtin_chat_templates() -> tuple[str, ...]:
    """The names llama.cpp renders itself."""
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(names, n)
    return tuple(sorted(name.decode() for name in names))


def apply_builtin_chat_template(name: str, messages: Sequence[tuple[str, str]], add_generation_prompt: bool) -> str:
    """The prompt text of (role, content) messages in llama.cpp's built-in format `name`.
    ValueError when llama.cpp cannot render them."""
    encoded = [(role.encode(), content.encode()) for role, content in messages]
    chat = (llama_cpp.llama_chat_message * max(1, len(encoded)))()
    for i, (role, content) in enumerate(encoded):
        chat[i].role = role
        chat[i].content = content
    size = 2 * sum(len(r) + len(c) for r, c in encoded) + 1024
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(encoded), add_generation_prompt, buf, size)
        if n < 0:
            raise ValueError(f"llama.cpp's built-in {name!r} chat template cannot render these messages")
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n  # too small: llama.cpp said how much it needs
    raise ValueError(f"llama.cpp's built-in {name!r} chat template gave no stable length")
