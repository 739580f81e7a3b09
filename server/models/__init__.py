"""Several models in one server, by name: the catalog (`--models-dir`, `--models-file`),
each model's config, the registry that loads and unloads them, and the requests in flight."""
