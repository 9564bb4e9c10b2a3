#!/usr/bin/env python3
"""PyTorch's side of `kiln bench --randomBatch=LO:HI`: the same batch draws (kiln's xorshift64 over
the same seed), a model of bench/perf_models.py in FP16 (channels-last for the CNNs), inputs resident
on the device and sliced from one buffer of HI rows, each run synchronized and timed. Modes: eager,
torch.compile with the batch dynamic (one graph for every batch: `dynamic=True`), and
reduce-overhead (CUDA graphs, recorded per batch as torch.compile's cudagraph trees do). Warm-up:
one run at each of LO, HI and the middle, so the compile is not timed but a batch never seen still
is, as kiln's first capture of a batch is. One JSON line per mode.

  python3 bench/random_batch_peer.py MODEL LO HI RUNS [SEED] [MODE ...]
"""
import json
import sys
import time
import warnings

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import perf_models  # noqa: E402

MASK = (1 << 64) - 1


def draws(lo, hi, runs, seed):
    """kiln bench's draws (tools/kiln/bench_cmd.cc, random_batch_bench)."""
    state = (seed * 0x9E3779B97F4A7C15 + 1) & MASK
    out = []
    for _ in range(runs):
        state ^= (state << 13) & MASK
        state ^= state >> 7
        state ^= (state << 17) & MASK
        out.append(lo + state % (hi - lo + 1))
    return out


def main():
    warnings.filterwarnings("ignore")
    name, lo, hi, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    seed = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    modes = sys.argv[6:] or ["eager", "dynamic", "reduce-overhead"]
    _, _, shape, cnn, _ = perf_models.PERF[name]
    model, example = perf_models.make(name)
    model = model.cuda().half().eval()
    if cnn:
        model = model.to(memory_format=torch.channels_last)
    full = example.repeat((hi,) + (1,) * len(shape)).cuda().half()
    if cnn:
        full = full.contiguous(memory_format=torch.channels_last)
    batches = draws(lo, hi, runs, seed)
    for mode in modes:
        torch._dynamo.reset()
        if mode == "eager":
            fn = model
        elif mode == "dynamic":
            fn = torch.compile(model, dynamic=True)
        else:
            fn = torch.compile(model, mode=mode)
        row = dict(model=name, mode=mode, lo=lo, hi=hi, runs=runs, seed=seed)
        try:
            t0 = time.time()
            with torch.no_grad():
                for b in sorted({lo, hi, (lo + hi) // 2}):
                    fn(full[:b])
                torch.cuda.synchronize()
                row["warmup_s"] = round(time.time() - t0, 1)
                ts = []
                for b in batches:
                    t = time.perf_counter()
                    y = fn(full[:b])
                    torch.cuda.synchronize()
                    ts.append((time.perf_counter() - t) * 1e3)
                    assert y.shape[0] == b
            ts.sort()
            row.update(median_ms=ts[len(ts) // 2], mean_ms=sum(ts) / len(ts), p90_ms=ts[int(0.9 * (len(ts) - 1))],
                       max_ms=ts[-1])
        except Exception as e:  # a mode that fails is a row, not the end of the run
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
