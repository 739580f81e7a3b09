"""Tests of the engine: slots, sampling, speculation, media, embeddings, on real llama.cpp."""
