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


def control_flow_models():
    """Models whose engines hold what came after the first fuzz campaign (issue 41): an If on data
    (guards), a Loop whose trip count is data, a Scan, a data-dependent output (NonZero) and
    kiln-domain ops, each over x [n, 4]: onnx_build_fuzz seeds, and engines for engine_load_fuzz."""
    f, i64, b = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    vi = helper.make_tensor_value_info
    scalar = lambda name, v, dt=np.int64: numpy_helper.from_array(np.array(v, dtype=dt), name)  # noqa: E731
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [vi("t", f, ["n", 4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", f, ["n", 4])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Add", ["s_in", "one_f"], ["s_out"])],
        "body", [vi("i", i64, []), vi("c_in", b, []), vi("s_in", f, ["n", 4])],
        [vi("c_out", b, []), vi("s_out", f, ["n", 4])], initializer=[scalar("one_f", 1.0, np.float32)])
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["acc", "row"], ["acc_out"]), helper.make_node("Identity", ["acc_out"], ["row_out"])],
        "scan_body", [vi("acc", f, [4]), vi("row", f, [4])], [vi("acc_out", f, [4]), vi("row_out", f, [4])])
    cases = {
        "if_on_data": [helper.make_node("ReduceSum", ["x"], ["sum"], keepdims=0),
                       helper.make_node("Greater", ["sum", "zero_f"], ["cond"]),
                       helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
        "loop_on_data": [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
                         helper.make_node("Mul", ["mx", "five_f"], ["m5"]),
                         helper.make_node("Clip", ["m5", "zero_f", "five_f"], ["mc"]),
                         helper.make_node("Cast", ["mc"], ["trips"], to=i64),
                         helper.make_node("Loop", ["trips", "true", "x"], ["y"], body=body)],
        "scan_cumsum": [helper.make_node("Scan", ["init", "x"], ["last", "y"], body=scan_body, num_scan_inputs=1)],
        "nonzero_gather": [helper.make_node("Greater", ["x", "zero_f"], ["pos"]),
                           helper.make_node("NonZero", ["pos"], ["nz"]),
                           helper.make_node("Transpose", ["nz"], ["ix"], perm=[1, 0]),
                           helper.make_node("GatherND", ["x", "ix"], ["y"])],
        "kiln_ops": [helper.make_node("MatMulBias", ["x", "w", "bias"], ["h"], domain="kiln", activation="relu"),
                     helper.make_node("Elementwise", ["h", "half"], ["y"], domain="kiln", ops=["Mul", "Sigmoid"],
                                      args=[0, 1, 2, -1], alpha=[0.0, 0.0], beta=[0.0, 0.0], to=[f, f])],
    }
    inits = [scalar("zero_f", 0.0, np.float32), scalar("five_f", 5.0, np.float32), scalar("true", True, np.bool_),
             numpy_helper.from_array(np.zeros(4, np.float32), "init"),
             numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 16, "w"),
             numpy_helper.from_array(np.linspace(-1, 1, 4, dtype=np.float32), "bias"), scalar("half", 0.5, np.float32)]
    for name, nodes in cases.items():
        used = {i for n in nodes for i in n.input}
        graph = helper.make_graph(nodes, name, [vi("x", f, ["n", 4])], [vi("y", f, None)],
                                  initializer=[t for t in inits if t.name in used])
        opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid("kiln", 1)] if name == "kiln_ops" else [])
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = 9
        yield name, model


def npy_bytes(a):
    with tempfile.TemporaryFile() as f:
        np.save(f, a)
        f.seek(0)
        return f.read()


def main(kiln, out):
    models_dir = os.environ.get("KILN_MODELS_DIR", os.path.join(ROOT, "..", "shared", "models"))
    targets = ["onnx_build_fuzz", "engine_load_fuzz", "dim_parse_fuzz", "tensor_file_fuzz", "cli_flags_fuzz"]
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
        for name, model in list(op_models()) + list(control_flow_models()):
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
    # Command lines as trtexec's and kiln's users type them: byte 0 picks the command (0 build, 1 run,
    # 2 bench, 3 inspect, 4 compare), NUL bytes separate the arguments (cli_flags_fuzz.cc).
    lines = [
        (0, ["--onnx=model.onnx", "--fp16", "--minShapes=x:1x3x224x224", "--optShapes=x:8x3x224x224",
             "--maxShapes=x:32x3x224x224", "--saveEngine=model.kiln", "--memPoolSize=workspace:4096M"]),
        (0, ["model.onnx", "--shapes=input_ids:1x128,'a,b':2x3", "--profile=1", "--minShapes=x:1x4",
             "--shapeSteps=x:1x2", "--dumpIR=after:canonicalize,fuse_attention", "--device=cuda", "--noTF32"]),
        (1, ["--loadEngine=model.kiln", "--shapes=x:2x4", "--loadInputs=x:in.npy", "--iterations=3",
             "--duration=0.5", "--exportOutput=out.json", "--seed=7"]),
        (2, ["model.kiln", "--useCudaGraph", "--noDataTransfers", "--warmUp=200", "--iterations=100",
             "--avgRuns=10", "--exportTimes=t.json", "--workspace=1024"]),
        (3, ["model.kiln", "--verbose", "--help"]),
        (4, ["--onnx=model.onnx", "--device=cuda", "--bf16", "--shapes=x:4x3x256x256", "--atol=1e-3", "--rtol=1e-2"]),
    ]
    for k, (command, args) in enumerate(lines):
        write("cli_flags_fuzz", f"line{k:02d}", bytes([command]) + b"\0".join(a.encode() for a in args))
    with open(os.path.join(out, "versions.txt"), "w") as f:
        kiln_version = subprocess.run([kiln, "--version"], capture_output=True, text=True).stdout.strip()
        f.write(f"onnx {onnx.__version__}\nnumpy {np.__version__}\n{kiln_version}\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "tests", "fuzz", "corpus"))
