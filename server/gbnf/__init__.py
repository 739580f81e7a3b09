"""Grammar building: GBNF that constrains sampling for tool calls and structured output.

- `text`: GBNF literals, character classes, and a grammar text's rules as a dict.
- `limits`: the bounds a JSON schema must keep so that its grammar compiles in bounded time
  and memory (400 beyond them, naming the keyword).
- `numbers`: exact ranges of JSON integers and plain decimals.
- `converter`: llama-cpp-python's JSON-schema converter, with the keywords it drops enforced.
- `patterns`: ``pattern`` regexes made portable, or dropped.
- `schema`: one schema as checked grammar rules (`convert_schema`).
- `rules`: a grammar under construction (`GrammarRules`) and the optional think block.
- `tools`: the grammar for `tool_choice`, one builder per tool-call format.
- `response_format`: the grammar for a `response_format` schema.

Everything here is pure Python except the final check of each grammar by llama.cpp
(`warmslot.slots.check_grammar`); all of it runs on the tokenize thread pool.
"""
