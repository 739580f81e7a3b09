"""llama-server's native API (`/completion`), an adapter over the one pipeline."""
