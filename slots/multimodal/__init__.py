"""Images and audio in a prompt: their placeholder spans and their prefill."""
