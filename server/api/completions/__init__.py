"""/v1/completions: the adapter (`route`) and its bodies and stream (`render`)."""
