#!/usr/bin/env python3
"""ONNX Runtime FP32 reference outputs for `kiln compare`.

Runs MODEL on ONNX Runtime's CPUExecutionProvider (FP32 kernels) with the inputs kiln wrote, and
writes each output as OUT_DIR/output_K.npy in the model's output order. Prints, on stdout,
`onnxruntime VERSION` and then one `output<TAB>K<TAB>NAME` line per output.

Usage: ort_reference.py --model M.onnx --input NAME=PATH [--input ...] --output-dir DIR
PATH is a .npy file or a serialized onnx.TensorProto (.pb). Exit status: 0 ok, 3 onnxruntime (or
numpy) cannot be imported (kiln then falls back to its own reference), 1 any other failure.
"""
import argparse
import os
import sys


def load_input(path):
    import numpy as np
    if path.endswith(".pb"):
        from onnx import TensorProto, numpy_helper
        proto = TensorProto()
        with open(path, "rb") as f:
            proto.ParseFromString(f.read())
        return numpy_helper.to_array(proto)
    return np.load(path, allow_pickle=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--output-dir", required=True)
    args = parser.parse_args()
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError as e:
        print(f"onnxruntime unavailable: {e}", file=sys.stderr)
        return 3

    feeds = {}
    for item in args.input:
        name, sep, path = item.rpartition("=")
        if not sep or not name:
            print(f"--input {item!r} is not NAME=PATH", file=sys.stderr)
            return 1
        feeds[name] = load_input(path)

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    outputs = session.run(names, feeds)
    os.makedirs(args.output_dir, exist_ok=True)
    print(f"onnxruntime {ort.__version__}")
    for k, (name, value) in enumerate(zip(names, outputs)):
        np.save(os.path.join(args.output_dir, f"output_{k}.npy"), np.ascontiguousarray(value))
        print(f"output\t{k}\t{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
