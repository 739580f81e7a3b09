"""The rerank API: /rerank and its aliases."""
