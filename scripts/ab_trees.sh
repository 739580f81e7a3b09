#!/usr/bin/env bash
# One benchmark against two source trees of warmslot in turn, on one machine: this checkout
# ("new") and another ("old": a folder holding its server/, slots/ and cache/, for example
# `mkdir .old && git archive REV server slots cache | tar x -C .old`, with /.old/ in
# .git/info/exclude and carried to a GPU call). Each server runs from its own tree's packages:
# a folder holding a `warmslot` namespace package of links to the tree's folders, passed to
# bench_gpu.py --warmslot-src; the harness is this checkout's for both.
#
# Usage: OLD=.old scripts/ab_trees.sh "old new new old" BENCH_GPU_ARGS...
#   e.g. OLD=.old scripts/ab_trees.sh "old new new old" -m /tmp/models/qwen3-8b-real.gguf \
#            --shape qwen3-8b -ngl 99 --servers warmslot --workloads throughput --tp-np 4,8
# Results: $OUT/ab-<i>-<tree>.json (and only the JSON, which keeps a GPU call's files few)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
order=${1:?usage: OLD=DIR $0 "old new ..." BENCH_GPU_ARGS...}
shift
old=$(cd "${OLD:?OLD: the other tree}" && pwd)
out=${OUT:-bench-out/ab}
mkdir -p "$out"
for tree in old new; do
    dir=$(mktemp -d)
    mkdir "$dir/warmslot"
    for pkg in server slots cache; do
        target=$PWD/$pkg
        [[ $tree == old ]] && target=$old/$pkg
        ln -s "$target" "$dir/warmslot/$pkg"
    done
    declare "src_$tree=$dir"
    PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH} python3 -c "import warmslot.slots as s; print('$tree:', s.__file__)"
done
i=0
for tree in $order; do
    i=$((i + 1))
    src=src_$tree
    echo "[ab_trees] run $i: $tree"
    python3 scripts/bench_gpu.py --warmslot-src "${!src}" --out "$out/ab-$i-$tree.json" "$@" 2>&1 | tail -3 \
        || echo "[ab_trees] run $i ($tree) failed"
done
