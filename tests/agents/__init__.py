"""Tests of agents and clients: Claude Code, Codex, agent frameworks through the official clients."""
