#!/usr/bin/env bash
# One benchmark against two source trees of warmslot in turn, on one machine: this checkout
# ("new") and another ("old": a folder holding its server/, slots/ and cache/, for example
# `mkdir .old && git archive REV server slots cache | tar x -C .old`, with /.old/ in
# .git/info/exclude and carried to a GPU call). Each server runs from its own tree's packages
# (a `warmslot` namespace folder put first on PYTHONPATH, through bench_gpu.py --python); the
# harness is this checkout's for both.
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
python=$(command -v python3)
for tree in old new; do
    dir=$(mktemp -d)
    mkdir "$dir/warmslot"
    for pkg in server slots cache; do
        src=$PWD/$pkg
        [[ $tree == old ]] && src=$old/$pkg
        ln -s "$src" "$dir/warmslot/$pkg"
    done
    printf '#!/usr/bin/env bash\nPYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH} exec %s "$@"\n' "$dir" "$python" > "$dir/python"
    chmod +x "$dir/python"
    declare "py_$tree=$dir/python"
    "$dir/python" -c "import warmslot.slots as s; print('$tree:', s.__file__)"
done
i=0
for tree in $order; do
    i=$((i + 1))
    py=py_$tree
    echo "[ab_trees] run $i: $tree"
    "$python" scripts/bench_gpu.py --python "${!py}" --out "$out/ab-$i-$tree.json" "$@" 2>&1 | tail -3 \
        || echo "[ab_trees] run $i ($tree) failed"
done
