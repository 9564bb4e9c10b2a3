"""kiln's CPU backend beside ONNX Runtime's CPU provider, interleaved in one process (issue 42).

For each shared model (../shared/models, or KILN_MODELS_DIR) at each of its test sets' shapes:
kiln's FP32 CPU engine (built once for the model's profile) and ONNX Runtime 1.30's CPU provider
with 1 and with 2 intra-op threads (and every graph optimization) run the same inputs in rounds,
kiln then ORT-1 then ORT-2, so a busy neighbour slows all three alike, each turn starting with one
untimed run. Each ORT turn makes its session afresh and drops it after, so that ORT's spinning
intra-op threads never share the cores with kiln's turn. Each figure is the median of every timed run after warm-up. kiln's output is checked against ORT's at 1e-4 + 1e-3*|ref|.
Peak resident memory: with --memory, each runtime runs the model alone in a child process and its
peak resident set (VmHWM) after the runs is reported (the Python interpreter, numpy and onnx
included in both).

    python bench/cpu_peer.py [--models=vit_tiny,unet_pixelshuffle] [--rounds=5] [--iters=5]
                             [--memory] [--json=out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

# numpy's own BLAS threads (OpenBLAS's server threads, which poll for work) would share the cores
# with the two runtimes being timed; neither runtime uses numpy's BLAS, and the checks need none.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
MODELS_DIR = pathlib.Path(os.environ.get("KILN_MODELS_DIR", HERE.parent.parent / "shared" / "models"))
sys.path.insert(0, str(HERE.parent / "python" / "tests"))
from shared_models import PROFILES  # noqa: E402  (the README profiles, shared with the tests)


def test_inputs(name):
    """[(input names -> arrays)] of the model's test_data_set_* folders."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(MODELS_DIR / name / "model.onnx"), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    sets = []
    for folder in sorted((MODELS_DIR / name).glob("test_data_set_*")):
        arrays = []
        for p in sorted(folder.glob("input_*.pb")):
            t = onnx.TensorProto()
            t.ParseFromString(p.read_bytes())
            arrays.append(numpy_helper.to_array(t))
        sets.append(dict(zip(names, arrays)))
    return sets


def kiln_runner(name):
    import kiln

    network = kiln.onnx.parse_file(str(MODELS_DIR / name / "model.onnx"))
    config = kiln.BuilderConfig()
    profile = kiln.OptimizationProfile()
    for input_name, (lo, opt, hi) in PROFILES[name].items():
        profile.set_dimensions(input_name, lo, opt, hi)
    config.add_profile(profile)
    engine = kiln.Builder(kiln.Device.CPU).build(network, config)
    context = engine.create_execution_context()
    return lambda feed: context.run(feed)


def ort_runner(name, threads):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(MODELS_DIR / name / "model.onnx"), options, providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    return lambda feed: dict(zip(outputs, session.run(outputs, feed)))


def timed(run, feed, iters):
    out = []
    for _ in range(iters):
        t = time.perf_counter()
        run(feed)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def close(a, e):
    a, e = np.asarray(a), np.asarray(e)
    if a.shape != e.shape:
        return False, float("inf")
    if a.dtype.kind != "f":
        return bool(np.array_equal(a, e)), 0.0
    err = np.abs(a.astype(np.float64) - e)
    return bool(np.all(err <= 1e-4 + 1e-3 * np.abs(e.astype(np.float64)))), float(err.max() if err.size else 0.0)


def memory_child(runtime, name, set_index, iters):
    """Runs in a child: the model on one runtime, then prints its peak resident set in MiB."""
    feed = test_inputs(name)[set_index]
    run = kiln_runner(name) if runtime == "kiln" else ort_runner(name, int(runtime[-1]))
    for _ in range(iters):
        run(feed)
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across fork and exec, so a child would report
    # its parent's peak; VmHWM belongs to the child's own address space.
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(int(hwm.split()[1]) / 1024.0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(PROFILES))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=5, help="timed runs per runtime per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--memory", action="store_true", help="peak RSS of each runtime alone, in child processes")
    p.add_argument("--json")
    p.add_argument("--_child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._child:
        memory_child(args._child[0], args._child[1], int(args._child[2]), int(args._child[3]))
        return 0
    if not (MODELS_DIR / "testmod_linear" / "model.onnx").exists():
        sys.exit(f"cpu_peer: {MODELS_DIR} holds no shared models (set KILN_MODELS_DIR)")
    import kiln
    import onnxruntime as ort

    print(f"kiln {kiln.__version__ if hasattr(kiln, '__version__') else ''} vs onnxruntime {ort.__version__}; "
          f"{os.cpu_count()} CPUs; medians of {args.rounds}x{args.iters} runs after {args.warmup} warm-up, ms")
    rows = []
    header = (f"{'model':<20} {'input':<18} {'kiln':>9} {'ORT 1t':>9} {'ORT 2t':>9} {'ORT best / kiln':>15} "
              f"{'max abs':>9}" + (f" {'RSS kiln':>9} {'RSS ORT':>9}" if args.memory else ""))
    print(header)
    for name in [m for m in args.models.split(",") if m]:
        # ONNX Runtime's intra-op threads spin while their session lives (allow_spinning, its
        # default and its faster setting), and on two cores a spinning thread takes the core
        # kiln's second thread runs on: ViT-tiny at batch 1 took kiln 14 ms after ORT's first turn
        # and 8.3 ms with ORT's sessions made without spinning. So each ORT turn makes its session
        # afresh (its first run untimed) and drops it after, and no runtime's pool is alive
        # during another's turn (kiln's workers spin 200 us, then block).
        kiln_run = kiln_runner(name)
        makers = {"kiln": lambda: kiln_run, "ort1": lambda: ort_runner(name, 1), "ort2": lambda: ort_runner(name, 2)}
        for si, feed in enumerate(test_inputs(name)):
            outs = {}
            for k, make in makers.items():
                r = make()
                outs[k] = r(feed)
                timed(r, feed, args.warmup)
                del r
                gc.collect()
            ok, worst = True, 0.0
            for out_name, ref in outs["ort1"].items():
                good, err = close(outs["kiln"][out_name], ref)
                ok, worst = ok and good, max(worst, err)
            times = {k: [] for k in makers}
            for _ in range(args.rounds):
                for k, make in makers.items():
                    r = make()
                    # One untimed run at the start of each turn: the runtime before it left the
                    # caches holding its own weights, and kiln, always timed right after ORT's
                    # two-thread turn, ran MobileNetV3-small 15-35% slower in its first runs of a
                    # turn than alone in the same process.
                    r(feed)
                    times[k] += timed(r, feed, args.iters)
                    del r
                    gc.collect()
            med = {k: statistics.median(v) for k, v in times.items()}
            best = min(med["ort1"], med["ort2"])
            shape = "x".join(str(d) for d in next(iter(feed.values())).shape)
            row = {"model": name, "input": shape, "kiln_ms": med["kiln"], "ort1_ms": med["ort1"], "ort2_ms": med["ort2"],
                   "speedup_vs_ort_best": best / med["kiln"], "max_abs": worst, "matches_ort": ok}
            line = (f"{name:<20} {shape:<18} {med['kiln']:9.3f} {med['ort1']:9.3f} {med['ort2']:9.3f} "
                    f"{best / med['kiln']:14.2f}x {worst:9.2e}{'' if ok else ' MISMATCH'}")
            if args.memory:
                rss = {}
                for runtime in ("kiln", "ort2"):
                    r = subprocess.run([sys.executable, __file__, "--_child", runtime, name, str(si), "3"],
                                       capture_output=True, text=True, check=True)
                    rss[runtime] = float(r.stdout.split()[-1])
                row.update(rss_kiln_mib=rss["kiln"], rss_ort_mib=rss["ort2"])
                line += f" {rss['kiln']:9.1f} {rss['ort2']:9.1f}"
            print(line, flush=True)
            rows.append(row)
    ratios = [r["speedup_vs_ort_best"] for r in rows]
    if ratios:
        print(f"geomean ORT best / kiln: {float(np.exp(np.mean(np.log(ratios)))):.3f}x over {len(ratios)} cases")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["matches_ort"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
