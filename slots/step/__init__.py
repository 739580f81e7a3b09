"""The parts of one engine step: the batch it plans (scheduler), the images a prefill reaches
(media_prefill), the token path after a decode (postprocess, text), the events back
(outbox), who yields when the pool is full (fairness)."""
