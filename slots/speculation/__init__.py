"""Speculative decoding: n-gram drafts, a draft model, MTP layers, and what verifying costs."""
