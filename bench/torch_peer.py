#!/usr/bin/env python3
"""PyTorch's side of scripts/gpu_perf.sh: the models of bench/perf_models.py on the GPU in FP16
(model.half(); channels-last for the CNNs, as a speed-minded PyTorch user runs them), inputs
resident on the device, timed like kiln (median of N runs after warm-up, each synchronized): eager,
and torch.compile in the modes that win at each batch (reduce-overhead, CUDA graphs, at batch 1;
default and max-autotune at the model's max batch: 64, 8 for GPT-2; gpu_perf.sh passes them). GPT-2
runs without an attention_mask (causal SDPA), as a PyTorch user calls it. One JSON line per
measurement.

  python3 bench/torch_peer.py ITERS BATCHES MODEL [MODE ...]

With KILN_PEER_PROFILE=DIR, each timed mode is also run 20 times under torch.profiler and DIR gets
torch.MODEL.MODE.bBATCH.txt: its CUDA kernels by total time, microseconds a run, beside kiln bench
--dumpProfile's table of the same model (scripts/gpu_perf.sh with KILN_PERF_PROFILE=1).
"""
import json
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import perf_models  # noqa: E402


# Warm-up before timing: at least 10 calls and WARMUP_S seconds of back-to-back calls, as `kiln bench
# --warmUp=500` warms up for 500 ms (a GPU idle during a build or compile runs its first hundreds of
# milliseconds at lower clocks).
WARMUP_S = float(os.environ.get("KILN_PEER_WARMUP_S", "0.5"))


def median_ms(fn, x, iters):
    with torch.no_grad():
        t0, n = time.perf_counter(), 0
        while n < 10 or time.perf_counter() - t0 < WARMUP_S:
            fn(x)
            torch.cuda.synchronize()
            n += 1
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(x)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def profile_kernels(fn, x, path, runs=20):
    """Writes fn(x)'s CUDA kernels to path: total microseconds a run, calls a run, name; the
    kernels' sum a run on the first line."""
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn(x)
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t, n = per.get(e.name, (0.0, 0))
            per[e.name] = (t + e.device_time_total, n + 1)
    rows = sorted(per.items(), key=lambda kv: -kv[1][0])
    with open(path, "w") as f:
        f.write(f"kernels: {sum(t for t, _ in per.values()) / runs:.1f} us a run over {runs} runs\n")
        for name, (t, n) in rows:
            f.write(f"{t / runs:10.1f} us {n / runs:6.1f}x  {name[:160]}\n")


def main():
    warnings.filterwarnings("ignore")
    iters, batches, name, modes = int(sys.argv[1]), [int(b) for b in sys.argv[2].split(",")], sys.argv[3], sys.argv[4:]
    _, _, shape, cnn, _ = perf_models.PERF[name]
    model, example = perf_models.make(name)
    model = model.cuda().half()
    if cnn:
        model = model.to(memory_format=torch.channels_last)
    for mode in modes or ["eager"]:
        for batch in batches:
            x = example.repeat((batch,) + (1,) * len(shape)).cuda()
            if x.is_floating_point():
                x = x.half()
                if cnn:
                    x = x.contiguous(memory_format=torch.channels_last)
            t0 = time.time()
            try:
                if mode == "eager":
                    fn = model
                else:
                    torch._dynamo.reset()
                    fn = torch.compile(model, mode=None if mode == "default" else mode)
                    with torch.no_grad():
                        fn(x)  # compiles
                compile_s = round(time.time() - t0, 1)
                ms = median_ms(fn, x, iters)
                row = dict(model=name, batch=batch, mode=mode, median_ms=ms, compile_s=compile_s)
                if os.environ.get("KILN_PEER_PROFILE"):
                    profile_kernels(fn, x, os.path.join(os.environ["KILN_PEER_PROFILE"],
                                                        f"torch.{name}.{mode}.b{batch}.txt"))
            except Exception as e:  # a mode that fails is a row, not the end of the run
                row = dict(model=name, batch=batch, mode=mode, error=f"{type(e).__name__}: {str(e)[:200]}")
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
