"""The benchmarks, the model generators and the harness they share with the tests.

A package, so that everything here is imported one way: `scripts.server_process`,
`scripts.bench_client`, `scripts.gpu_bench`, ... from the repository root. The tests import
it from there (pytest puts the root on the path); a script run as a file
(`python scripts/bench_x.py`) puts the root on the path itself, in its first lines.
"""
