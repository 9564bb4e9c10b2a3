#!/usr/bin/env bash
# The benchmark, run on the GPU host from the repository root after scripts/gpu.sh built build-gpu.
# Exports ResNet-50, MobileNetV3-Large, ViT-B/16, Swin-T, BERT-base and DistilBERT (seq 128) and
# GPT-2 small (seq 256, one forward pass, no KV cache) with seeded random weights
# (bench/perf_models.py); each transformer twice, by the TorchScript exporter (NAME) and by torch's
# default dynamo exporter (NAME-dynamo), builds kiln engines
# for batch 1..N (opt N; N is the model's max_batch in perf_models.PERF: 64 for the CNNs, 32 for the
# transformers) in TF32
# and FP16, times them at batch 1 and N with device-resident IO in CUDA graphs (kiln bench
# --useCudaGraph --noDataTransfers), then PyTorch FP16 on the same models in the same run
# (bench/torch_peer.py: eager and torch.compile), and writes docs/performance.md
# (bench/perf_report.py). Medians over KILN_BENCH_ITERS runs (200).
# The dynamic-shape check is the model bert_base_dyn (BERT-base exported with dynamic batch and
# sequence): two FP16 engines at batch 8 (fixed), one whose profile spans seq 16..512 (opt 128) and
# one built for 8x384 alone (min = opt = max), both timed at 8x384; the medians and their ratio go
# to perf.log and dynamic.jsonl (must: the spanning engine within 1.15x). PyTorch times it at 8x384
# in eager and default torch.compile.
# KILN_PERF_MODELS (unset: all of them, bert_base_dyn included; empty: none, for a serving-only
# run), KILN_PERF_PRECISIONS (default
# "fp16 tf32") and KILN_PERF_TORCH_MODES narrow the run (KILN_PERF_TORCH=0 times kiln alone,
# KILN_PERF_KILN=0 PyTorch alone into an earlier run's LOG; KILN_PERF_AUTOTUNE=0 drops
# max-autotune, whose compile takes minutes a model); logs go to $OUT, else build-gpu/perf.
# KILN_PERF_KILN_TORCH (default "resnet50 bert_base_s128 gpt2"; empty skips) times kiln.torch at
# the max batch beside kiln bench on its engine and torch.compile (bench/kiln_torch_peer.py).
# KILN_PERF_SERVE (default none) serves models on Ray Serve, on one GPU and on two where there are
# two, beside kiln bench on the same engine (scripts/serve_load_test.py; see below).
# KILN_PERF_COMPARE=1 checks each model against ONNX Runtime FP32 in FP16, BF16 and strict FP32
# (kiln compare; accuracy.jsonl); with KILN_PERF_KILN=0 KILN_PERF_TORCH=0 it is all that runs.
# KILN_PERF_NCU=1 also profiles each FP16 engine at its max batch under ncu (kernel times, no clock
# control) and writes where the time goes to profile.MODEL.txt (bench/ncu_summary.py).
# KILN_PERF_PROFILE=1 writes kiln bench --dumpProfile of each FP16 engine at its max batch to
# layers.MODEL.txt and, for every PyTorch mode timed, its CUDA kernels under torch.profiler to
# torch.MODEL.MODE.bBATCH.txt (bench/torch_peer.py): where each side's time goes, side by side.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-build-gpu/perf}
mkdir -p "$LOG"
BUILD=${KILN_GPU_BUILD_DIR:-build-gpu}
KILN=$BUILD/tools/kiln/kiln
ITERS=${KILN_BENCH_ITERS:-200}
MODELS=${KILN_PERF_MODELS-resnet50 mobilenet_v3_large convnext_tiny efficientnet_v2_s vit_b_16 vit_b_16-dynamo swin_t swin_t-dynamo bert_base_s128 \
bert_base_s128-dynamo distilbert_s128 distilbert_s128-dynamo gpt2 gpt2-dynamo bert_base_dyn}
DIR=$BUILD/perf-models
[ -x "$KILN" ] || { echo "gpu_perf: $KILN is missing: run scripts/gpu.sh first" >&2; exit 1; }
# The GPU host has no network: the dynamo exporter's onnxscript (and onnx-ir) travel as wheels in
# .gpu_models/wheels (pip download onnxscript==0.7.2 onnx-ir --no-deps) where its python lacks them.
if ! python3 -c "import onnxscript" 2>/dev/null && ls .gpu_models/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target "$BUILD/pyextra" .gpu_models/wheels/*.whl
  export PYTHONPATH="$PWD/$BUILD/pyextra${PYTHONPATH:+:$PYTHONPATH}"
fi
PRECS=${KILN_PERF_PRECISIONS:-fp16 tf32}
if [ "${KILN_PERF_KILN:-1}" = 0 ]; then
  # PyTorch's side alone, into the same LOG as an earlier kiln run (its perf.log is kept).
  nvidia-smi -L >/dev/null 2>&1
else
  nvidia-smi -L 2>&1 | tee "$LOG/perf.log"
fi
python3 -c "import torch; print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}')" \
  >"$LOG/versions.txt" 2>/dev/null || echo "torch not importable" >"$LOG/versions.txt"
[ -z "$MODELS" ] || python3 bench/perf_models.py export "$DIR" $MODELS >>"$LOG/perf.log" 2>&1 || { tail -20 "$LOG/perf.log"; exit 1; }

# A model's NAME.json (perf_models.py): input name, shape without the batch (x-joined), max batch,
# the batches timed (space-separated) and the sequence profile of a dynamic-sequence model (min opt
# max), "-" for the others.
meta() {
  python3 -c "import json;j=json.load(open('$DIR/$1.json'));print(j['input'],'x'.join(map(str,j['shape'])),j['max_batch'],\
','.join(map(str,j['batches'])),','.join(map(str,j.get('seq_profile',[]))) or '-')"
}
median() {  # the median latency of a kiln bench --exportTimes file, or null
  python3 -c "import json;print(json.load(open('$1'))['latency_ms']['median'])" 2>/dev/null || echo null
}

# The dynamic-shape check of model $1 (FP16, batch fixed at its max batch): an engine whose profile
# spans the sequence range against one built for the timed shape alone, both timed at that shape.
dynamic_check() {
  local m=$1 input=$2 seq=$3 b=$4 smin sopt smax kind flags
  IFS=, read -r smin sopt smax <<<"$5"
  declare -A ms built
  for kind in span fixed; do
    local engine=$DIR/$m.$kind.fp16.kiln
    if [ $kind = span ]; then
      flags=(--minShapes="$input:${b}x$smin" --optShapes="$input:${b}x$sopt" --maxShapes="$input:${b}x$smax")
    else
      flags=(--minShapes="$input:${b}x$seq" --optShapes="$input:${b}x$seq" --maxShapes="$input:${b}x$seq")
    fi
    ms[$kind]=null; built[$kind]=null
    local t0=$(date +%s.%N)
    if ! "$KILN" build --onnx="$DIR/$m.onnx" --device=cuda --fp16 "${flags[@]}" --saveEngine="$engine" \
        >"$LOG/build.$m.$kind.log" 2>&1; then
      echo "kiln build $m $kind FAILED: $(tail -3 "$LOG/build.$m.$kind.log")" | tee -a "$LOG/perf.log"; continue
    fi
    built[$kind]=$(python3 -c "import time;print(round(time.time()-$t0,1))")
    rm -f "$LOG/dyn.$m.$kind.json"
    "$KILN" bench --loadEngine="$engine" --shapes="$input:${b}x$seq" --useCudaGraph --noDataTransfers \
      --iterations="$ITERS" --warmUp=500 --exportTimes="$LOG/dyn.$m.$kind.json" >"$LOG/bench.$m.$kind.log" 2>&1 \
      || echo "kiln bench $m $kind FAILED: $(tail -3 "$LOG/bench.$m.$kind.log")" | tee -a "$LOG/perf.log"
    ms[$kind]=$(median "$LOG/dyn.$m.$kind.json")
    echo "kiln $m fp16 $kind engine at ${b}x$seq: $(grep -m1 'latency (ms)' "$LOG/bench.$m.$kind.log")" | tee -a "$LOG/perf.log"
  done
  python3 - "$m" "$b" "$seq" "$smin" "$sopt" "$smax" "${ms[span]}" "${ms[fixed]}" "${built[span]}" "${built[fixed]}" \
      <<'PY' | tee -a "$LOG/dynamic.jsonl"
import json, sys
m, b, seq, smin, sopt, smax = sys.argv[1], *map(int, sys.argv[2:7])
span, fixed, span_s, fixed_s = (json.loads(v) for v in sys.argv[7:11])
ratio = round(span / fixed, 3) if span and fixed else None
print(json.dumps(dict(model=m, prec="fp16", batch=b, seq=seq, span_seq=[smin, sopt, smax], span_ms=span, fixed_ms=fixed,
                      ratio=ratio, limit=1.15, ok=ratio is not None and ratio <= 1.15, span_build_s=span_s,
                      fixed_build_s=fixed_s)))
PY
  tail -1 "$LOG/dynamic.jsonl" | python3 -c "import json,sys;r=json.load(sys.stdin);print(f\"kiln {r['model']} fp16 at \
{r['batch']}x{r['seq']}: engine spanning seq {r['span_seq'][0]}..{r['span_seq'][2]} (opt {r['span_seq'][1]}) {r['span_ms']} ms, \
engine for {r['batch']}x{r['seq']} alone {r['fixed_ms']} ms, ratio {r['ratio']} (limit 1.15: {'pass' if r['ok'] else 'FAIL'})\")" \
    | tee -a "$LOG/perf.log"
}

[ "${KILN_PERF_KILN:-1}" = 0 ] && MODELS_KILN="" || MODELS_KILN=$MODELS
[ -n "$MODELS_KILN" ] && : >"$LOG/kiln_builds.jsonl" && : >"$LOG/dynamic.jsonl"
for m in $MODELS_KILN; do
  read -r input shape maxb batches seqp < <(meta "$m")
  if [ "$seqp" != - ]; then
    dynamic_check "$m" "$input" "$shape" "$maxb" "$seqp"
    continue
  fi
  for prec in $PRECS; do
    engine=$DIR/$m.$prec.kiln
    cache=$DIR/$m.$prec.timing-cache
    rm -f "$cache"
    flags=(--onnx="$DIR/$m.onnx" --device=cuda --minShapes="$input:1x$shape" --optShapes="$input:${maxb}x$shape"
           --maxShapes="$input:${maxb}x$shape" --timingCacheFile="$cache")
    [ $prec = fp16 ] && flags+=(--fp16)
    # Built twice: the first build times the tactics and writes the timing cache, the second reads
    # it; the report gives both build times and whether the two engine files are byte-identical.
    t0=$(date +%s.%N)
    if ! "$KILN" build "${flags[@]}" --saveEngine="$engine" >"$LOG/build.$m.$prec.log" 2>&1; then
      echo "kiln build $m $prec FAILED: $(tail -3 "$LOG/build.$m.$prec.log")" | tee -a "$LOG/perf.log"; continue
    fi
    secs=$(python3 -c "import time;print(round(time.time()-$t0,1))")
    t0=$(date +%s.%N)
    "$KILN" build "${flags[@]}" --saveEngine="$engine.cached" >"$LOG/build.$m.$prec.cached.log" 2>&1
    cached_secs=$(python3 -c "import time;print(round(time.time()-$t0,1))")
    identical=false
    cmp -s "$engine" "$engine.cached" && identical=true
    "$KILN" inspect "$engine" >"$LOG/inspect.$m.$prec.txt" 2>&1
    act=$(grep -m1 -i "activation memory" "$LOG/inspect.$m.$prec.txt" | sed 's/^ *//')
    # Layers, and those that are an attention (ONNX Attention or kiln::PackedAttention), from
    # inspect's "layers: N" and "by op: OP N ..." lines.
    read -r layers attn < <(python3 - "$LOG/inspect.$m.$prec.txt" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
n = re.search(r"^layers: (\d+)", t, re.M)
ops = re.search(r"^\s*by op: (.*)$", t, re.M)
d = {k: int(v) for k, v in re.findall(r"(\w+) (\d+)", ops.group(1))} if ops else {}
print(n.group(1) if n else "null", d.get("Attention", 0) + d.get("PackedAttention", 0))
PY
)
    echo "{\"model\": \"$m\", \"prec\": \"$prec\", \"max_batch\": $maxb, \"shape\": \"$shape\", \"build_s\": $secs, \"cached_build_s\": $cached_secs, \"identical\": $identical, \"layers\": ${layers:-null}, \"attention_layers\": $attn, \"activation\": \"$act\"}" >>"$LOG/kiln_builds.jsonl"
    echo "kiln $m $prec: $layers layers, $attn attention layers" | tee -a "$LOG/perf.log"
    echo "kiln $m $prec: built in $secs s, again with the timing cache in $cached_secs s, engines identical: $identical" | tee -a "$LOG/perf.log"
    for b in ${batches//,/ }; do
      "$KILN" bench --loadEngine="$engine" --shapes="$input:${b}x$shape" --useCudaGraph --noDataTransfers \
        --iterations="$ITERS" --warmUp=500 --exportTimes="$LOG/kiln.$m.$prec.b$b.json" >"$LOG/bench.$m.$prec.b$b.log" 2>&1 \
        || echo "kiln bench $m $prec b$b FAILED: $(tail -3 "$LOG/bench.$m.$prec.b$b.log")" | tee -a "$LOG/perf.log"
      echo "kiln $m $prec batch $b: $(grep -m1 'latency (ms)' "$LOG/bench.$m.$prec.b$b.log")" | tee -a "$LOG/perf.log"
    done
    if [ "${KILN_PERF_PROFILE:-0}" = 1 ] && [ $prec = fp16 ]; then
      "$KILN" bench --loadEngine="$engine" --shapes="$input:${maxb}x$shape" --noDataTransfers --iterations=50 \
        --warmUp=500 --dumpProfile >"$LOG/layers.$m.txt" 2>&1 ||
        echo "kiln bench --dumpProfile $m FAILED: $(tail -3 "$LOG/layers.$m.txt")" | tee -a "$LOG/perf.log"
    fi
    if [ "${KILN_PERF_NCU:-0}" = 1 ] && [ $prec = fp16 ] && command -v ncu >/dev/null; then
      # bench runs the engine twice here: one check run, then the one timed iteration.
      timeout 240 ncu --clock-control none --metrics gpu__time_duration.sum --csv "$KILN" bench \
        --loadEngine="$engine" --shapes="$input:${maxb}x$shape" --noDataTransfers --iterations=1 --warmUp=0 \
        >"$LOG/ncu.$m.csv" 2>"$LOG/ncu.$m.err" &&
        python3 bench/ncu_summary.py "$LOG/ncu.$m.csv" 2 20 >"$LOG/profile.$m.txt" 2>&1
      head -12 "$LOG/profile.$m.txt" 2>/dev/null | sed "s/^/profile $m fp16 b$maxb: /" | tee -a "$LOG/perf.log"
    fi
  done
done

# KILN_PERF_COMPARE=1: each model's accuracy against ONNX Runtime FP32 (kiln compare, seeded
# inputs at batch 2, an engine built for that shape) in FP16, BF16 and strict FP32 (--noTF32, kiln
# compare's FP32 tolerance); one line each in perf.log and accuracy.jsonl. The FP16/BF16 verdict is
# cosine >= 0.999 per output (compare's tolerances for those are tight for a whole transformer).
if [ "${KILN_PERF_COMPARE:-0}" = 1 ]; then
  : >"$LOG/accuracy.jsonl"
  for m in $MODELS; do
    read -r input shape maxb batches seqp < <(meta "$m")
    [ "$seqp" != - ] && continue
    for prec in fp16 bf16 fp32; do
      case $prec in fp16) pf=--fp16 ;; bf16) pf=--bf16 ;; fp32) pf=--noTF32 ;; esac
      timeout 300 "$KILN" compare --onnx="$DIR/$m.onnx" --device=cuda $pf --shapes="$input:2x$shape" \
        >"$LOG/compare.$m.$prec.log" 2>&1
      python3 - "$m" "$prec" $? "$LOG/compare.$m.$prec.log" <<'PY' | tee -a "$LOG/accuracy.jsonl"
import json, sys
m, prec, rc, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
# kiln compare's table: a header "output shape max_abs max_rel mean_abs p99_abs cosine top1 ...
# result", then a row per output until a blank line.
lines, rows = open(log).read().splitlines(), []
for i, l in enumerate(lines):
    if l.split()[:3] == ["output", "shape", "max_abs"]:
        for r in lines[i + 1:]:
            if not r.strip():
                break
            rows.append(r.split())
outs = [dict(output=r[0], max_abs=float(r[2]), cosine=float(r[6]), verdict=r[-1]) for r in rows]
ok = bool(outs) and (all(o["verdict"] == "PASS" for o in outs) if prec == "fp32"
                     else all(o["cosine"] >= 0.999 for o in outs))
print(json.dumps(dict(model=m, prec=prec, rc=rc, outputs=outs, ok=ok)))
PY
    done
  done
  python3 -c "
import json
for l in open('$LOG/accuracy.jsonl'):
    r = json.loads(l)
    o = ', '.join(f\"{x['output']} cosine {x['cosine']:.6f} max abs {x['max_abs']:.3g} {x['verdict']}\" for x in r['outputs'])
    print(f\"accuracy {r['model']} {r['prec']}: {o or 'no output (rc ' + str(r['rc']) + ')'}: {'ok' if r['ok'] else 'FAIL'}\")
" | tee -a "$LOG/perf.log"
fi

: >"$LOG/torch.jsonl"
if [ "${KILN_PERF_TORCH:-1}" = 0 ]; then
  echo "PyTorch peer skipped: KILN_PERF_TORCH=0" | tee -a "$LOG/perf.log"
elif python3 -c "import torch, torchvision, transformers" 2>/dev/null; then
  peers_done=" "
  for m in $MODELS; do
    read -r input shape maxb batches seqp < <(meta "$m")
    # Both exports of a model share one PyTorch module, so one peer run.
    peer=${m%-dynamo}
    [[ $peers_done == *" $peer "* ]] && continue
    peers_done+="$peer "
    for b in ${batches//,/ }; do
      # reduce-overhead (CUDA graphs) wins at batch 1; at the max batch every mode is timed;
      # the dynamic-shape check's model only eager and default.
      modes="eager reduce-overhead"
      [ "$b" != 1 ] && modes="eager default reduce-overhead max-autotune"
      [ "$seqp" != - ] && modes="eager default"
      [ "${KILN_PERF_AUTOTUNE:-1}" = 0 ] && modes=${modes/ max-autotune/}
      [ -n "${KILN_PERF_TORCH_MODES:-}" ] && modes=$KILN_PERF_TORCH_MODES
      KILN_PEER_PROFILE=$([ "${KILN_PERF_PROFILE:-0}" = 1 ] && echo "$LOG") \
        python3 bench/torch_peer.py "$ITERS" "$b" "$peer" $modes 2>>"$LOG/torch.err" | tee -a "$LOG/torch.jsonl"
    done
  done
else
  echo "PyTorch peer skipped: torch, torchvision or transformers not importable" | tee -a "$LOG/perf.log"
fi
# The Python package of this build (its sources beside the extension) in one folder, made once for
# the parts below that import it, in PY_SITE; false when the extension was not built or did not
# install.
PY_SITE=""
python_site() {
  if [ -z "$PY_SITE" ]; then
    local site=$BUILD/perf-site
    rm -rf "$site" && mkdir -p "$site" && cp -r python/kiln "$site/"
    ls "$BUILD"/python/_kiln*.so >/dev/null 2>&1 &&
      cmake --install "$BUILD" --component python --prefix "$site" >"$LOG/python_install.log" 2>&1 && PY_SITE=$site
  fi
  [ -n "$PY_SITE" ]
}
# kiln.torch beside the engine it builds and beside torch.compile, in one process (issue 36):
# bench/kiln_torch_peer.py on the Python package built into $BUILD, its table into
# kiln_torch.md and perf.log. KILN_PERF_KILN_TORCH: its models (empty skips).
KT_MODELS=${KILN_PERF_KILN_TORCH-resnet50 bert_base_s128 gpt2}
if [ -n "$KT_MODELS" ] && [ "${KILN_PERF_KILN:-1}" != 0 ]; then
  if python_site; then
    PYTHONPATH="$PY_SITE${PYTHONPATH:+:$PYTHONPATH}" timeout "${KILN_PERF_KILN_TORCH_TIMEOUT:-900}" \
      python3 bench/kiln_torch_peer.py "$KILN" "$DIR" "$ITERS" $KT_MODELS >"$LOG/kiln_torch.log" 2>&1 ||
      echo "kiln.torch peer: rc $? ($(tail -1 "$LOG/kiln_torch.log"))" | tee -a "$LOG/perf.log"
    grep -E "^\|" "$LOG/kiln_torch.log" | tee "$LOG/kiln_torch.md" | tee -a "$LOG/perf.log"
  else
    echo "kiln.torch peer skipped: the Python extension was not built or did not install" | tee -a "$LOG/perf.log"
  fi
fi
# Serving on Ray Serve (issue 40): KILN_PERF_SERVE names the models (default none). Each one's FP16
# engine for batch 1..32 is served by scripts/serve_load_test.py through DeploymentHandles (host
# arrays in and out, as a request holds them): 8-row requests from 8 client processes of 16
# threads, each replica with 2 contexts. Beside it, `kiln bench` on the same engine with host IO
# (run() on host tensors: the copies each way included) at batches 8, 16 and 32.
# KILN_PERF_SERVE_LAYOUTS: replicas:GPUs-each pairs (default "1:1 2:0.5 2:1": one replica on a GPU,
# two sharing one as Ray's fractional GPUs place them, one on each of two GPUs where there are two).
# KILN_PERF_SERVE_BUCKETS=8,16,32 runs each batch from its bucket's CUDA graph (--batchBuckets).
# KILN_PERF_SERVE_RAY_PATH=grpc takes Ray Serve's gRPC request path (kiln serve --rayPath; the
# default, actor, is Ray's own); Ray's floor (bench/serve_floor.py) follows it.
# The GPU host has no network: where its python lacks Ray, `.gpu_ray/site.tar.xz` (ray[serve] and
# what it needs that the host lacks, for Python 3.12) is unpacked onto PYTHONPATH.
SERVE_MODELS=${KILN_PERF_SERVE:-}
if [ -n "$SERVE_MODELS" ] && [ "${KILN_PERF_KILN:-1}" != 0 ]; then
  SPATH=""
  python_site && SPATH=$PY_SITE
  if [ -n "$SPATH" ] && ! python3 -c "import ray.serve" 2>/dev/null && [ -f .gpu_ray/site.tar.xz ]; then
    rm -rf "$BUILD/raysite" && mkdir -p "$BUILD/raysite" && tar -xJf .gpu_ray/site.tar.xz -C "$BUILD/raysite" --strip-components=1
    SPATH=$SPATH:$PWD/$BUILD/raysite
  fi
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
  if [ -z "$SPATH" ]; then
    echo "serving skipped: the Python extension was not built or did not install" | tee -a "$LOG/perf.log"
  elif ! PYTHONPATH="$SPATH" python3 -c "import ray.serve" >"$LOG/serve_import.log" 2>&1; then
    echo "serving skipped: Ray Serve is not importable ($(tail -1 "$LOG/serve_import.log"))" | tee -a "$LOG/perf.log"
  else
    : >"$LOG/serve.jsonl"
    python3 bench/perf_models.py export "$DIR" $SERVE_MODELS >>"$LOG/serve_export.log" 2>&1
    for m in $SERVE_MODELS; do
      read -r input shape _ _ _ < <(meta "$m")
      engine=$DIR/$m.serve.fp16.kiln
      if ! "$KILN" build --onnx="$DIR/$m.onnx" --device=cuda --fp16 --minShapes="$input:1x$shape" \
          --optShapes="$input:32x$shape" --maxShapes="$input:32x$shape" --saveEngine="$engine" >"$LOG/serve.build.$m.log" 2>&1; then
        echo "serving $m: kiln build FAILED: $(tail -3 "$LOG/serve.build.$m.log")" | tee -a "$LOG/perf.log"; continue
      fi
      benches=""
      for b in 8 16 32; do
        "$KILN" bench --loadEngine="$engine" --shapes="$input:${b}x$shape" --iterations="$ITERS" --warmUp=500 \
          --exportTimes="$LOG/serve.bench.$m.b$b.json" >"$LOG/serve.bench.$m.b$b.log" 2>&1
        benches="$benches $b:$(median "$LOG/serve.bench.$m.b$b.json")"
      done
      # Ray Serve's own cost a request: a deployment returning its input beside this engine's
      # (KILN_PERF_SERVE_FLOOR=0 leaves it out).
      if [ "${KILN_PERF_SERVE_FLOOR:-1}" = 1 ]; then
        KILN_RAY_PATH="${KILN_PERF_SERVE_RAY_PATH:-actor}" PYTHONPATH="$SPATH" timeout 120 python3 bench/serve_floor.py "$engine" 3000 32 1 1 >"$LOG/serve.floor.$m.log" 2>&1
        echo "serving $m, Ray's floor (bench/serve_floor.py, 8-row handle calls from 32 threads): $(grep 'requests/s' "$LOG/serve.floor.$m.log" | tr '\n' ' ')" | tee -a "$LOG/perf.log"
      fi
      # replicas:GPUs each (one replica on a GPU, two sharing one, one on each of two GPUs)
      for rg in ${KILN_PERF_SERVE_LAYOUTS:-1:1 2:0.5 2:1}; do
        r=${rg%%:*}; g=${rg##*:}; need=$(python3 -c "import math;print(math.ceil($r*$g))")
        [ "$need" -le "$NGPU" ] || { echo "serving $m: $r replica(s) of $g GPU not run: this host has $NGPU GPU" | tee -a "$LOG/perf.log"; continue; }
        tag=$m.r$r.g$g
        PYTHONPATH="$SPATH" timeout "${KILN_PERF_SERVE_TIMEOUT:-300}" python3 scripts/serve_load_test.py \
          --loadEngine="$engine" --replicas="$r" --gpusPerReplica="$g" --via=handle --requests="${KILN_PERF_SERVE_REQUESTS:-6000}" \
          --clients=16 --clientProcesses="${KILN_PERF_SERVE_CLIENTS:-8}" --contexts="${KILN_PERF_SERVE_CONTEXTS:-2}" ${KILN_PERF_SERVE_BUCKETS:+--batchBuckets=$KILN_PERF_SERVE_BUCKETS} --minRows=8 --maxRows=8 --maxBatch=32 --batchWaitMs=2 --warmup=400 \
          --distinct=64 --rtol=0.02 --atol=0.05 --rayPath="${KILN_PERF_SERVE_RAY_PATH:-actor}" \
          --json="$LOG/serve.$tag.json" >"$LOG/serve.$tag.log" 2>&1
        echo "serving $m, $r replica(s) of $g GPU: rc $? $(grep -E '^(requests|throughput|batches)' "$LOG/serve.$tag.log" | tr '\n' ' ')" | tee -a "$LOG/perf.log"
        python3 - "$m" "$r" "$need" "$LOG/serve.$tag.json" $benches <<'PY' | tee -a "$LOG/serve.jsonl"
import json, sys
m, r, gpus, path, benches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
try:
    s = json.load(open(path))
except (OSError, ValueError):
    raise SystemExit(0)
bench = {int(b): (None if ms == "null" else float(ms)) for b, ms in (x.split(":") for x in benches)}
formed = s["mean_rows_per_batch"]
near = min(bench, key=lambda b: abs(b - formed))  # kiln bench at the batch nearest the mean formed one
rows_s = {b: round(b * 1000 / ms, 1) for b, ms in bench.items() if ms}
ratio = round(s["throughput_rows_per_s"] / (gpus * rows_s[near]), 3) if rows_s.get(near) else None
print(json.dumps(dict(model=m, replicas=r, gpus=gpus, rows_per_s=s["throughput_rows_per_s"], requests_per_s=s["throughput_rps"],
                      latency_ms=s["latency_ms"], mean_rows_per_batch=formed, replica_run_ms_per_batch=s["replica_run_ms_per_batch"],
                      replica_engine_ms_per_batch=s.get("replica_engine_ms_per_batch"),
                      lost=s["lost"], wrong=s["wrong"], answered_twice=s["answered_twice"], kiln_bench_ms=bench,
                      kiln_bench_rows_per_s=rows_s, bench_batch=near, of_kiln_bench_per_gpu=ratio)))
PY
      done
    done
  fi
fi
python3 bench/perf_report.py "$LOG" docs/performance.md "scripts/gpu_perf.sh" | tee -a "$LOG/perf.log"
cp docs/performance.md "$LOG/performance.md"
