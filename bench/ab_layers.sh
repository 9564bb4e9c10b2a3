#!/usr/bin/env bash
# A/B of kiln binaries (or engines) on a noisy machine: each BINARY:ENGINE pair runs `kiln bench
# --exportProfile` in turn, ROUNDS times interleaved; prints, per pair, the sum over layers of
# each layer's smallest median across the rounds, and the end-to-end medians of the rounds. The
# per-layer minimum is what moved least on the 2-core development VM, whose wall times drift by
# up to 30% between runs. Per-layer minima go to $OUT/ab_N.json (default /tmp) for comparing
# layers.
#   bash bench/ab_layers.sh ROUNDS THREADS SHAPES BINARY:ENGINE [BINARY:ENGINE ...]
#   bash bench/ab_layers.sh 5 1 x:1x3x224x224 /tmp/kiln_old:/tmp/m.kiln build/tools/kiln/kiln:/tmp/m.kiln
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,9p' "$0"; exit 2; }
rounds=$1 threads=$2 shapes=$3
shift 3
out=${OUT:-/tmp}
for r in $(seq "$rounds"); do
  i=0
  for pair in "$@"; do
    "${pair%%:*}" bench --loadEngine="${pair#*:}" --shapes="$shapes" --threads="$threads" \
      --iterations=150 --exportProfile="$out/ab_${i}_$r.json" >"$out/ab_${i}_$r.txt" 2>&1
    i=$((i + 1))
  done
done
python3 - "$rounds" "$#" "$out" <<'PY'
import json, re, sys
rounds, pairs, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for i in range(pairs):
    mins, medians = {}, []
    for r in range(1, rounds + 1):
        for layer in json.load(open(f"{out}/ab_{i}_{r}.json")):
            if "name" in layer:
                mins[layer["name"]] = min(mins.get(layer["name"], float("inf")), layer["medianMs"])
        medians.append(float(re.search(r"median ([0-9.]+)", open(f"{out}/ab_{i}_{r}.txt").read()).group(1)))
    print(f"pair {i}: layers' minima summed {sum(mins.values()):.3f} ms; end-to-end medians {sorted(medians)}")
    json.dump(mins, open(f"{out}/ab_{i}.json", "w"), indent=1)
PY
