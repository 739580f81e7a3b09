"""LoRA adapters: the set a request runs under (`AdapterSet`, the cache scope it gives its
state) and the adapters loaded on the model (`ModelAdapters`)."""
