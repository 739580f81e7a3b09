"""Tests of the project itself: docs, structure, benchmarks' harness, generated models."""
