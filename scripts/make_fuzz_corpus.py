#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/) from the bundled demo model,
the small shared models (../shared/models, or KILN_MODELS_DIR), a few one-op models made here, and
engines the kiln CLI builds from them. Usage: make_fuzz_corpus.py KILN_BINARY [OUT_DIR]
Records the producing tools' versions in OUT_DIR/versions.txt. Deterministic apart from those."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_demo_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Small models only: the corpus stays a few MB, and the fuzzer runs faster on small inputs.
SHARED = {"testmod_linear": "x:1x1x16,x:2x3x16,x:4x5x16", "unet_pixelshuffle": "x:1x3x8x8,x:1x3x8x8,x:2x3x16x16",
          "llama_tiny": None}


def op_models():
    """One-op models over a dynamic dim, so the fuzzer starts near shape arithmetic and kernels."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    vi = helper.make_tensor_value_info
    const = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)  # noqa: E731
    cases = {
        "reshape": ([helper.make_node("Reshape", ["x", "s"], ["y"])], [const("s", [-1, 4])]),
        "slice": ([helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])],
                  [const("st", [1]), const("en", [-1]), const("ax", [1]), const("sp", [2])]),
        "gather": ([helper.make_node("Gather", ["x", "ix"], ["y"], axis=1)], [const("ix", [0, -1, 2])]),
        "concat": ([helper.make_node("Concat", ["x", "x"], ["y"], axis=0)], []),
        "expand": ([helper.make_node("Expand", ["x", "s"], ["y"])], [const("s", [2, 1, 4])]),
        "transpose": ([helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])], []),
        "reduce": ([helper.make_node("ReduceMean", ["x", "ax"], ["y"], keepdims=0)], [const("ax", [1])]),
        "softmax": ([helper.make_node("Softmax", ["x"], ["y"], axis=1)], []),
        "pad": ([helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")], [const("p", [0, 1, 0, 2])]),
        "tile": ([helper.make_node("Tile", ["x", "r"], ["y"])], [const("r", [2, 3])]),
        "shape_range": ([helper.make_node("Shape", ["x"], ["sh"]),
                         helper.make_node("ReduceProd", ["sh"], ["n"], keepdims=0),
                         helper.make_node("Range", ["z", "n", "one"], ["r"]),
                         helper.make_node("Cast", ["r"], ["y"], to=f)],
                        [numpy_helper.from_array(np.array(0, np.int64), "z"),
                         numpy_helper.from_array(np.array(1, np.int64), "one")]),
        "maxpool": ([helper.make_node("Unsqueeze", ["x", "a"], ["x4"]),
                     helper.make_node("Unsqueeze", ["x4", "a"], ["x5"]),
                     helper.make_node("MaxPool", ["x5"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 1, 1])],
                    [const("a", [0])]),
        "split_where": ([helper.make_node("Split", ["x"], ["a", "b"], axis=1, num_outputs=2),
                         helper.make_node("Greater", ["a", "b"], ["c"]),
                         helper.make_node("Where", ["c", "a", "b"], ["y"])], []),
    }
    for name, (nodes, inits) in cases.items():
        graph = helper.make_graph(nodes, name, [vi("x", f, ["n", 4])], [vi("y", f, None)],
                                  initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        model.ir_version = 9
        yield name, model


def npy_bytes(a):
    with tempfile.TemporaryFile() as f:
        np.save(f, a)
        f.seek(0)
        return f.read()


def main(kiln, out):
    models_dir = os.environ.get("KILN_MODELS_DIR", os.path.join(ROOT, "..", "shared", "models"))
    targets = ["onnx_build_fuzz", "engine_load_fuzz", "dim_parse_fuzz", "tensor_file_fuzz"]
    for t in targets:
        # Overwrites its own files and keeps the rest: regression inputs (regress_*) live there too.
        os.makedirs(os.path.join(out, t), exist_ok=True)
    write = lambda t, name, data: open(os.path.join(out, t, name), "wb").write(data)  # noqa: E731

    with tempfile.TemporaryDirectory() as tmp:
        make_demo_model.main(os.path.join(tmp, "demo"))
        models = {"demo_cnn": (os.path.join(tmp, "demo", "model.onnx"), "image:1x3x32x32,image:2x3x32x32,image:3x3x32x32")}
        for name, shapes in SHARED.items():
            path = os.path.join(models_dir, name, "model.onnx")
            if os.path.exists(path):
                models[name] = (path, shapes)
            else:
                print(f"make_fuzz_corpus: {path} is absent; skipped")
        for name, model in op_models():
            path = os.path.join(tmp, name + ".onnx")
            onnx.save(model, path)
            models[name] = (path, "x:1x4,x:2x4,x:3x4")
        for name, (path, shapes) in models.items():
            write("onnx_build_fuzz", name, open(path, "rb").read())
            if shapes is None:
                continue
            lo, opt, hi = shapes.split(",") if "," in shapes else (shapes,) * 3
            # *.kiln is git-ignored, so the corpus names engines by their model alone.
            engine = os.path.join(out, "engine_load_fuzz", name)
            subprocess.run([kiln, "build", "--onnx=" + path, "--saveEngine=" + engine, "--minShapes=" + lo,
                            "--optShapes=" + opt, "--maxShapes=" + hi], check=True, stdout=subprocess.DEVNULL)

        # Input files: byte 0 picks the reader (even .npy, odd .pb), as tensor_file_fuzz.cc reads them.
        rng = np.random.default_rng(13)
        arrays = {"f32": rng.standard_normal((2, 3)).astype(np.float32), "f16": np.ones((4,), np.float16),
                  "i64": np.arange(6, dtype=np.int64).reshape(1, 2, 3), "bool": np.array([True, False]),
                  "u8": np.zeros((2, 0, 3), np.uint8), "scalar": np.array(1.5, np.float64),
                  "i32": np.array([[1, -2]], np.int32)}
        for name, a in arrays.items():
            write("tensor_file_fuzz", name + ".npy", b"\x00" + npy_bytes(a))
            write("tensor_file_fuzz", name + ".pb", b"\x01" + numpy_helper.from_array(a, name).SerializeToString())
        typed = helper.make_tensor("typed", TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0])
        write("tensor_file_fuzz", "typed_fields.pb", b"\x01" + typed.SerializeToString())
        with open(os.path.join(tmp, "demo", "test_data_set_0", "input_0.pb"), "rb") as f:
            write("tensor_file_fuzz", "demo_input.pb", b"\x01" + f.read())

    # Dim expressions as exporters write them, and as Dim prints them.
    dims = ["batch", "4*h", "seq_len + 1", "8*s39", "floor(h/2)", "s0//2", "Mod(a, 4)", "min(a, b)",
            "max(2*a - 1, b)", "ceil(h/3)", "CeilToInt(IntTrueDiv(s0, 2))", "(a + 1)*(b - 2) % 7",
            "-(-n // 8)", "floor((h + 2*1 - 3)/2) + 1"]
    for k, d in enumerate(dims):
        write("dim_parse_fuzz", f"dim{k:02d}", d.encode())
    with open(os.path.join(out, "versions.txt"), "w") as f:
        kiln_version = subprocess.run([kiln, "--version"], capture_output=True, text=True).stdout.strip()
        f.write(f"onnx {onnx.__version__}\nnumpy {np.__version__}\n{kiln_version}\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "tests", "fuzz", "corpus"))
