"""Tests of the HTTP APIs: OpenAI, Anthropic, Vertex, native, tool calls, templates, bad input, metrics."""
