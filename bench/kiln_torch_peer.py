#!/usr/bin/env python3
"""kiln.torch on the GPU beside the engine it builds and beside torch.compile, in one process (issue
36): a model of bench/perf_models.py held as a GPU user holds it (`.cuda().half()`, channels-last for
the CNNs), compiled by `kiln.torch.compile` for batch 1..MAX (opt MAX) in FP16, then at batch MAX:

- kiln.torch: `compiled(x)` with its CUDA graphs (the default: inputs staged, outputs cloned) and
  with `cuda_graphs=False` (the caller's tensors bound in place, kernels launched one by one);
- the engine alone: the same engine's bytes through `kiln bench --useCudaGraph --noDataTransfers`;
- PyTorch: eager and torch.compile (default, reduce-overhead) on the same module and input.

Each Python figure is the median of ITERS calls after warm-up (at least 0.5 s, as kiln bench's),
each synchronized (as bench/torch_peer.py times PyTorch); the cosine of kiln.torch's output
against the module's own.
One JSON line per model, then a Markdown table. KILN_TORCH_PEER_MODES narrows the torch.compile
modes (default "default reduce-overhead").

  python3 bench/kiln_torch_peer.py KILN_CLI OUT_DIR ITERS MODEL...
"""
import json
import os
import re
import subprocess
import sys
import warnings

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import perf_models  # noqa: E402
from torch_peer import median_ms  # noqa: E402

import kiln.torch as kt  # noqa: E402


def main():
    warnings.filterwarnings("ignore")
    cli, out_dir, iters, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    os.makedirs(out_dir, exist_ok=True)  # gpu_perf.sh's model folder, absent when it exported none
    rows = []
    for name in names:
        _, input_name, shape, cnn, max_batch = perf_models.PERF[name]
        model, example = perf_models.make(name)
        model = model.cuda().half()
        if cnn:
            model = model.to(memory_format=torch.channels_last)
        x = example.repeat((max_batch,) + (1,) * len(shape)).cuda()
        if x.is_floating_point():
            x = x.half()
            if cnn:
                x = x.contiguous(memory_format=torch.channels_last)
        row = {"model": name, "batch": max_batch}
        spec = kt.Input(min_shape=(1,) + shape, opt_shape=(max_batch,) + shape, max_shape=(max_batch,) + shape,
                        dtype=x.dtype, name=input_name)
        compiled = kt.compile(perf_models.exportable(name, model), inputs=[spec], enabled_precisions={torch.half},
                              device="cuda")
        with torch.no_grad():
            want = model(x)
            want = want.last_hidden_state if hasattr(want, "last_hidden_state") else want
            want = want[0] if isinstance(want, (tuple, list)) else want
            got = compiled(x)
        row["cosine"] = round(torch.nn.functional.cosine_similarity(
            got.double().flatten(), want.double().flatten(), dim=0).item(), 6)
        for graphs in (True, False):
            compiled.cuda_graphs = graphs
            row["kiln_torch_ms" if graphs else "kiln_torch_no_graphs_ms"] = median_ms(compiled, x, iters)
        row["graph_stats"] = compiled._context.cuda_graph_stats
        engine_path = f"{out_dir}/{name}.kiln_torch.kiln"
        with open(engine_path, "wb") as f:
            f.write(bytes(compiled.engine.serialize()))
        # The engine's own input shape at the max batch: [N, H, W, C] where kiln.torch built it
        # channels-last (a channels-last module's images).
        engine_shape = [max_batch if d < 0 else d for d in compiled.engine.get_tensor_shape(compiled.input_names[0])]
        dims = "x".join(str(d) for d in engine_shape)
        bench = subprocess.run([cli, "bench", f"--loadEngine={engine_path}", "--useCudaGraph", "--noDataTransfers",
                                f"--shapes={compiled.input_names[0]}:{dims}", f"--iterations={iters}"],
                               capture_output=True, text=True, timeout=300)
        m = re.search(r"median ([0-9.]+)", bench.stdout)
        row["kiln_bench_ms"] = float(m.group(1)) if m else None
        if not m:
            row["kiln_bench_error"] = (bench.stdout + bench.stderr)[-300:]
        del compiled
        row["eager_ms"] = median_ms(model, x, iters)
        for mode in os.environ.get("KILN_TORCH_PEER_MODES", "default reduce-overhead").split():
            torch._dynamo.reset()
            try:
                fn = torch.compile(model, mode=None if mode == "default" else mode)
                with torch.no_grad():
                    fn(x)
                row[f"torch_compile_{mode}_ms"] = median_ms(fn, x, iters)
            except Exception as e:  # a mode that fails is noted, not the end of the run
                row[f"torch_compile_{mode}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        torch._dynamo.reset()
        print(json.dumps(row), flush=True)
        rows.append(row)

    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else "-"

    print("\n| model | batch | kiln.torch (CUDA graphs) | kiln.torch (no graphs) | kiln bench | kiln.torch / kiln bench "
          "| eager | torch.compile default | torch.compile reduce-overhead | cosine |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["kiln_torch_ms"] / r["kiln_bench_ms"] if r.get("kiln_bench_ms") else None
        print(f"| {r['model']} | {r['batch']} | {fmt(r['kiln_torch_ms'])} | {fmt(r['kiln_torch_no_graphs_ms'])} | "
              f"{fmt(r.get('kiln_bench_ms'))} | {fmt(ratio)} | {fmt(r['eager_ms'])} | "
              f"{fmt(r.get('torch_compile_default_ms'))} | {fmt(r.get('torch_compile_reduce-overhead_ms'))} | "
              f"{r['cosine']} |")


if __name__ == "__main__":
    main()
