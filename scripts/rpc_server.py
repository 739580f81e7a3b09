"""llama.cpp's rpc-server from the llama-cpp-python that warmslot runs: lends this host's GPUs
(else its CPU) to `warmslot --rpc` and `llama-server --rpc` elsewhere. Needs llama-cpp-python
built with the RPC backend (scripts/build_rpc.sh).

    python scripts/rpc_server.py 127.0.0.1:50052 [--threads N]

RPC has no authentication: listen on loopback or a trusted network only.
"""

from __future__ import annotations

import argparse
import logging
import sys

from warmslot.slots.llama_api import LlamaError
from warmslot.slots.llama_api.placement import serve_rpc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("endpoint", help="host:port to listen on")
    p.add_argument("-t", "--threads", type=int, default=1, help="CPU threads when the CPU is lent")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve_rpc(a.endpoint, threads=a.threads)
    except (LlamaError, ValueError) as exc:
        print(f"rpc_server: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
