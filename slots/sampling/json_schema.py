"""llama-cpp-python's JSON-schema-to-GBNF converter, for the server's grammar building.

Pure Python (no calls into llama.cpp); it is reached through here so that llama-cpp-python is
a dependency of `slots` alone.
"""

from llama_cpp.llama_grammar import PRIMITIVE_RULES, RESERVED_NAMES, STRING_FORMAT_RULES, SchemaConverter

__all__ = ["PRIMITIVE_RULES", "RESERVED_NAMES", "STRING_FORMAT_RULES", "SchemaConverter"]
