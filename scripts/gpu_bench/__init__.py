"""The GPU side-by-side benchmark of warmslot and llama-server, run by scripts/bench_gpu.py.

Pieces: `text` and `agent` make what is sent, `client` sends it and times it, `servers` starts
the servers, one `workload_*` module per workload, `profiling` samples warmslot with py-spy,
`cli` runs it all and `summary` prints the console tables. `report_*`, `markdown` and `plot`
are the pieces of scripts/bench_report.py that belong to the newer workloads.
"""

WARMSLOT = "warmslot"
LLAMA_SERVER = "llama-server"
SERVERS = (LLAMA_SERVER, WARMSLOT)
