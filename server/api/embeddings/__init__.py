"""The embeddings API: /v1/embeddings (and llama-server's /embedding)."""
