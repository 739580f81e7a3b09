"""/v1/chat/completions: the adapter (`route`) and its bodies and stream (`render`)."""
