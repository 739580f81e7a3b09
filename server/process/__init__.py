"""The server process: flags and their config, finding the model, sleeping and draining."""
