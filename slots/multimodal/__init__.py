"""Images and audio in a prompt: the spans of placeholder ids that stand for them (what the
step does with them is slots/step/media_prefill.py)."""
