"""The versions `--version`, /version and /props report: warmslot, llama-cpp-python and the
llama.cpp (ggml) build it carries."""

from __future__ import annotations

import functools
from importlib import metadata

from warmslot.slots import ggml_build


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def version_info() -> dict[str, str]:
    ggml, commit = ggml_build()
    return {
        "version": _package_version("warmslot"),
        "llama_cpp_python": _package_version("llama_cpp_python"),
        "ggml": ggml,
        "llama_cpp_commit": commit,
    }


def build_info() -> str:
    """One line, as llama-server's build_info: which llama.cpp this server runs."""
    v = version_info()
    return f"warmslot {v['version']}, llama.cpp {v['llama_cpp_commit']} (ggml {v['ggml']}, llama-cpp-python {v['llama_cpp_python']})"


def version_text() -> str:
    return build_info()
