"""Memory fitting: what the model, the KV pool and the host buffers take, and settling
unset flags so that everything fits the devices (`--fit`)."""
