"""Prompt memory outside the slots: checkpoints and the RAM prompt cache."""
