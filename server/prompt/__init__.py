"""Prompt building: a request's messages, tools and media to the tokens the engine reads."""
