"""Sampling: the parameters a request samples with, the batch sampler, logprobs, JSON schemas
as grammars, the reasoning budget."""
