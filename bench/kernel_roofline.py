#!/usr/bin/env python3
"""kiln's memory-bound kernels beside the GPU's copy bandwidth (issue 38's micro-benchmark).

For each kernel class (elementwise, the broadcasts models use, Softmax, the norms, reductions,
transposes, Cast, Concat, Split, Slice, Gather, Pad, Resize, pooling) at the largest shape the zoo's
models give it, and for each dtype, this writes a one-node ONNX model whose inputs and outputs have
that dtype, builds it with `kiln build` (--fp16 / --bf16 / --noTF32), and times it with `kiln bench
--noDataTransfers --exportProfile` (the median of each layer's time over 100 runs, each layer
between CUDA events: the same measure `--dumpProfile` prints for a model's layers). Bytes are what
the kernel must move at least: each input read once (a broadcast operand at its own size) and each
output written once. Beside it, in the same process and between the same kind of events, torch
copies a buffer of half those bytes device to device (read + write = the same traffic): the copy
rate of this GPU at that size. One table on stdout, one JSON object per row in OUT/roofline.jsonl.

  python3 bench/kernel_roofline.py KILN OUT [--dtypes=fp16,fp32,bf16] [--only=NAME,...] [--device=cpu]

Needs onnx and numpy; torch with CUDA for the copy (without it the copy column is empty).
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DTYPES = {"fp16": (TensorProto.FLOAT16, np.float16, 2, ["--fp16"]),
          "fp32": (TensorProto.FLOAT, np.float32, 4, ["--noTF32"]),
          "bf16": (TensorProto.BFLOAT16, None, 2, ["--bf16"])}


def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def weight(name, shape, dt):
    """A float initializer of the row's dtype (bfloat16 written as raw bits of float32's top half)."""
    v = (np.random.default_rng(0).standard_normal(shape) * 0.1 + 1.0).astype(np.float32)
    if dt == "bf16":
        bits = (v.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        return helper.make_tensor(name, TensorProto.BFLOAT16, shape, bits, raw=True)
    return numpy_helper.from_array(v.astype(DTYPES[dt][1]), name)


def numel(shape):
    return int(np.prod(shape, dtype=np.int64))


# Each case: name, the class it stands for, the shape it comes from, and a function of the dtype
# giving (nodes, inputs as (name, shape, elem_type or None for the row's dtype), outputs likewise,
# initializers, opset). Bytes are computed from the inputs, initializers of the row's dtype that
# the kernel reads (weights of norms, gates), and outputs.
def cases():
    out = []

    def add(name, klass, origin, fn):
        out.append((name, klass, origin, fn))

    vit_mlp = [64, 197, 3072]
    vit = [64, 197, 768]
    scores = [32, 12, 256, 256]
    nchw = [64, 256, 56, 56]
    for op, extra in (("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Erf", {}), ("HardSwish", {}),
                      ("Gelu", {"approximate": "none"}), ("Gelu", {"approximate": "tanh"})):
        label = op if not extra else f"{op}({extra['approximate']})"
        add(f"unary {label}", "unary", "ViT-B/16 MLP b64",
            lambda dt, op=op, extra=extra: ([helper.make_node(op, ["x"], ["y"], **extra)],
                                            [("x", vit_mlp, None)], [("y", vit_mlp, None)], [], 20))
    add("SiLU x*sigmoid(x) (Elementwise)", "elementwise program", "EfficientNetV2-S b32",
        lambda dt: ([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
                    [("x", [32, 256, 48, 48], None)], [("y", [32, 256, 48, 48], None)], [], 17))
    add("Add same shape (residual)", "binary", "ViT-B/16 b64",
        lambda dt: ([helper.make_node("Add", ["x", "z"], ["y"])], [("x", vit, None), ("z", vit, None)],
                    [("y", vit, None)], [], 17))
    add("Add bias [C]", "broadcast", "ViT-B/16 MLP b64",
        lambda dt: ([helper.make_node("Add", ["x", "b"], ["y"])], [("x", vit_mlp, None)],
                    [("y", vit_mlp, None)], [weight("b", [3072], dt)], 17))
    add("Add position [1,S,E]", "broadcast", "GPT-2 b32",
        lambda dt: ([helper.make_node("Add", ["x", "p"], ["y"])], [("x", [32, 256, 768], None)],
                    [("y", [32, 256, 768], None)], [weight("p", [1, 256, 768], dt)], 17))
    add("Mul per-channel [N,C,1,1] (SE)", "broadcast", "ResNet-50 stage 1 b64",
        lambda dt: ([helper.make_node("Mul", ["x", "g"], ["y"])], [("x", nchw, None), ("g", [64, 256, 1, 1], None)],
                    [("y", nchw, None)], [], 17))
    add("Add mask [N,1,1,S]", "broadcast", "GPT-2 scores b32",
        lambda dt: ([helper.make_node("Add", ["x", "m"], ["y"])], [("x", scores, None), ("m", [32, 1, 1, 256], None)],
                    [("y", scores, None)], [], 17))
    add("Add mask [1,1,S,S]", "broadcast", "GPT-2 scores b32",
        lambda dt: ([helper.make_node("Add", ["x", "m"], ["y"])], [("x", scores, None)],
                    [("y", scores, None)], [weight("m", [1, 1, 256, 256], dt)], 17))
    add("Softmax last axis", "softmax", "GPT-2 scores b32",
        lambda dt: ([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", scores, None)],
                    [("y", scores, None)], [], 17))
    add("Softmax(x + mask [N,1,1,S])", "softmax", "BERT scores b32",
        lambda dt: ([helper.make_node("Add", ["x", "m"], ["a"]), helper.make_node("Softmax", ["a"], ["y"], axis=-1)],
                    [("x", [32, 12, 128, 128], None), ("m", [32, 1, 1, 128], None)],
                    [("y", [32, 12, 128, 128], None)], [], 17))
    # Both run as one kiln::BiasSoftmax layer (fuse_bias_softmax): the mask is read in the
    # softmax's pass instead of an Add writing the scores first.
    add("Softmax(x + mask [1,1,S,S])", "softmax", "GPT-2 causal scores b32",
        lambda dt: ([helper.make_node("Add", ["x", "m"], ["a"]), helper.make_node("Softmax", ["a"], ["y"], axis=-1)],
                    [("x", scores, None)], [("y", scores, None)], [weight("m", [1, 1, 256, 256], dt)], 17))
    add("LayerNorm 768", "norm", "ViT-B/16 b64",
        lambda dt: ([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)],
                    [("x", vit, None)], [("y", vit, None)], [weight("s", [768], dt), weight("b", [768], dt)], 17))
    add("LayerNorm 96 (ConvNeXt)", "norm", "ConvNeXt-T stage 1 b32, channels last",
        lambda dt: ([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-6)],
                    [("x", [32, 56, 56, 96], None)], [("y", [32, 56, 56, 96], None)],
                    [weight("s", [96], dt), weight("b", [96], dt)], 17))
    add("RMSNorm 1024", "norm", "Llama-style decoder b32 s256",
        lambda dt: ([helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=-1, epsilon=1e-6)],
                    [("x", [32, 256, 1024], None)], [("y", [32, 256, 1024], None)], [weight("s", [1024], dt)], 23))
    add("GroupNorm 32 groups", "norm", "UNet 320 channels 64x64 b8",
        lambda dt: ([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=32, epsilon=1e-5)],
                    [("x", [8, 320, 64, 64], None)], [("y", [8, 320, 64, 64], None)],
                    [weight("s", [320], dt), weight("b", [320], dt)], 21))
    add("BatchNorm (inference)", "norm", "ResNet-50 stage 1 b64",
        lambda dt: ([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
                    [("x", nchw, None)], [("y", nchw, None)],
                    [weight(k, [256], dt) for k in ("s", "b", "m", "v")], 15))
    add("ReduceMean last axis", "reduce", "ViT-B/16 b64",
        lambda dt: ([helper.make_node("ReduceMean", ["x", "ax"], ["y"], keepdims=1)], [("x", vit, None)],
                    [("y", [64, 197, 1], None)], [const("ax", np.array([-1], np.int64))], 18))
    add("ReduceMean H,W (GAP)", "reduce", "ResNet-50 stage 1 b64",
        lambda dt: ([helper.make_node("ReduceMean", ["x", "ax"], ["y"], keepdims=1)], [("x", nchw, None)],
                    [("y", [64, 256, 1, 1], None)], [const("ax", np.array([2, 3], np.int64))], 18))
    add("ReduceSum middle axis", "reduce", "ViT-B/16 b64 (tokens)",
        lambda dt: ([helper.make_node("ReduceSum", ["x", "ax"], ["y"], keepdims=1)], [("x", vit, None)],
                    [("y", [64, 1, 768], None)], [const("ax", np.array([1], np.int64))], 18))
    add("Transpose NCHW->NHWC", "transpose", "ResNet-50 stage 1 b64",
        lambda dt: ([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1])], [("x", nchw, None)],
                    [("y", [64, 56, 56, 256], None)], [], 17))
    add("Transpose heads [B,S,H,D]->[B,H,S,D]", "transpose", "GPT-2 b32",
        lambda dt: ([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1, 3])], [("x", [32, 256, 12, 64], None)],
                    [("y", [32, 12, 256, 64], None)], [], 17))
    add("Transpose Swin windows", "transpose", "Swin-T stage 1 b32",
        lambda dt: ([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 1, 3, 2, 4, 5])],
                    [("x", [32, 8, 7, 8, 7, 96], None)], [("y", [32, 8, 8, 7, 7, 96], None)], [], 17))
    add("Cast to float32", "cast", "GPT-2 output b32",
        lambda dt: ([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT if dt != "fp32" else TensorProto.FLOAT16)],
                    [("x", [32, 256, 768], None)],
                    [("y", [32, 256, 768], TensorProto.FLOAT if dt != "fp32" else TensorProto.FLOAT16)], [], 17))
    add("Concat last axis", "copy", "ViT-B/16 b64",
        lambda dt: ([helper.make_node("Concat", ["x", "z"], ["y"], axis=-1)],
                    [("x", [64, 197, 384], None), ("z", [64, 197, 384], None)], [("y", vit, None)], [], 17))
    add("Concat channels", "copy", "DenseNet/UNet-style b64",
        lambda dt: ([helper.make_node("Concat", ["x", "z"], ["y"], axis=1)],
                    [("x", [64, 128, 56, 56], None), ("z", [64, 128, 56, 56], None)], [("y", nchw, None)], [], 17))
    add("Split QKV last axis", "copy", "GPT-2 b32",
        lambda dt: ([helper.make_node("Split", ["x", "sp"], ["q", "k", "v"], axis=-1)], [("x", [32, 256, 2304], None)],
                    [(n, [32, 256, 768], None) for n in "qkv"], [const("sp", np.array([768] * 3, np.int64))], 18))
    add("Slice half of last axis", "copy", "Llama rotate_half b32",
        lambda dt: ([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])], [("x", [32, 256, 16, 64], None)],
                    [("y", [32, 256, 16, 32], None)],
                    [const("st", np.array([32], np.int64)), const("en", np.array([64], np.int64)),
                     const("ax", np.array([3], np.int64))], 17))
    add("Gather embedding rows", "gather", "GPT-2 wte b32",
        lambda dt: ([helper.make_node("Gather", ["w", "ids"], ["y"], axis=0)], [("ids", [32, 256], TensorProto.INT64)],
                    [("y", [32, 256, 768], None)], [weight("w", [50257, 768], dt)], 17))
    add("Pad 1 (constant)", "copy", "ResNet-style stem b64",
        lambda dt: ([helper.make_node("Pad", ["x", "p"], ["y"], mode="constant")], [("x", [64, 96, 56, 56], None)],
                    [("y", [64, 96, 58, 58], None)], [const("p", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], 18))
    for mode in ("nearest", "linear"):
        add(f"Resize x2 {mode}", "resize", "UNet decoder b8",
            lambda dt, mode=mode: ([helper.make_node("Resize", ["x", "", "sc"], ["y"], mode=mode)],
                                   [("x", [8, 128, 128, 128], None)], [("y", [8, 128, 256, 256], None)],
                                   [const("sc", np.array([1, 1, 2, 2], np.float32))], 18))
    add("MaxPool 3x3 s2", "pool", "ResNet-50 stem b64",
        lambda dt: ([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
                    [("x", [64, 64, 112, 112], None)], [("y", [64, 64, 56, 56], None)], [], 17))
    add("AveragePool 2x2 s2", "pool", "DenseNet transition b64",
        lambda dt: ([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                    [("x", nchw, None)], [("y", [64, 256, 28, 28], None)], [], 17))
    return out


def model_bytes(inputs, outputs, inits, dt, size):
    total = 0
    for _, shape, et in list(inputs) + list(outputs):
        total += numel(shape) * (size if et is None else {TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2,
                                                          TensorProto.INT64: 8}[et])
    for t in inits:
        if t.data_type in (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.BFLOAT16):
            total += numel(list(t.dims)) * size
    return total


def gather_bytes(inputs, outputs, size):
    """Gather reads the rows it gathers, not the whole table: ids, then as many bytes as it writes."""
    ids = numel(inputs[0][1]) * 8
    out = numel(outputs[0][1]) * size
    return ids + 2 * out


def copy_rate(nbytes, iters=200):
    """Device-to-device copy of nbytes / 2 (read + write = nbytes) between CUDA events, as kiln
    times a layer: the median GB/s, or None without torch/CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    half = max(nbytes // 2, 16)
    a = torch.empty(half, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(20):
        b.copy_(a)
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return 2 * half / (ts[len(ts) // 2] * 1e-3) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kiln")
    ap.add_argument("out")
    ap.add_argument("--dtypes", default="fp16,fp32,bf16")
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (no copy column)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    only = [s for s in args.only.split(",") if s]
    rows = []
    jl = open(os.path.join(args.out, "roofline.jsonl"), "w")
    print(f"{'kernel':40} {'dtype':5} {'MB':>8} {'us':>8} {'GB/s':>7} {'copy GB/s':>9} {'% copy':>7}  layers")
    for name, klass, origin, fn in cases():
        if only and not any(o in name for o in only):
            continue
        for dt in args.dtypes.split(","):
            et, _, size, flags = DTYPES[dt]
            nodes, inputs, outputs, inits, opset = fn(dt)
            vi = lambda n, s, e: helper.make_tensor_value_info(n, et if e is None else e, s)  # noqa: E731
            g = helper.make_graph(nodes, "k", [vi(*i) for i in inputs], [vi(*o) for o in outputs], inits)
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
            stem = os.path.join(args.out, f"{len(rows):02d}_{dt}")
            onnx.save(m, stem + ".onnx")
            nbytes = gather_bytes(inputs, outputs, size) if klass == "gather" else model_bytes(inputs, outputs, inits, dt, size)
            row = dict(kernel=name, klass=klass, origin=origin, dtype=dt, bytes=nbytes)
            b = subprocess.run([args.kiln, "build", f"--onnx={stem}.onnx", f"--device={args.device}", *flags,
                                f"--saveEngine={stem}.kiln"], capture_output=True, text=True)
            if b.returncode != 0:
                row["error"] = (b.stdout + b.stderr).strip().splitlines()[-1][:200]
            else:
                r = subprocess.run([args.kiln, "bench", f"--loadEngine={stem}.kiln", "--noDataTransfers",
                                    "--iterations=100", "--warmUp=200", f"--exportProfile={stem}.profile.json"],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    row["error"] = (r.stdout + r.stderr).strip().splitlines()[-1][:200]
                else:
                    prof = json.load(open(stem + ".profile.json"))[1:]
                    row["us"] = round(sum(p["medianMs"] for p in prof) * 1e3, 2)
                    row["layers"] = [p["name"] for p in prof]
                    row["GBps"] = round(nbytes / (row["us"] * 1e-6) / 1e9, 1)
            row["copy_GBps"] = copy_rate(nbytes) if args.device == "cuda" else None
            if row["copy_GBps"] and row.get("GBps"):
                row["copy_GBps"] = round(row["copy_GBps"], 1)
                row["pct_copy"] = round(100 * row["GBps"] / row["copy_GBps"], 1)
            rows.append(row)
            jl.write(json.dumps(row) + "\n")
            jl.flush()
            if "error" in row:
                print(f"{name:40} {dt:5} {nbytes / 1e6:8.1f}  error: {row['error']}")
            else:
                print(f"{name:40} {dt:5} {nbytes / 1e6:8.1f} {row['us']:8.1f} {row['GBps']:7.0f} "
                      f"{row.get('copy_GBps') or 0:9.0f} {row.get('pct_copy') or 0:7.1f}  {len(row['layers'])}",
                      flush=True)
    jl.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
