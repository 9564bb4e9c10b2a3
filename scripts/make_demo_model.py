#!/usr/bin/env python3
"""Builds kiln's bundled demo model with onnx's helper API: a small CNN classifier with a dynamic
batch (Conv-Relu-Conv-Relu-GlobalAveragePool-Flatten-Gemm-Softmax), seeded weights, and ONNX Runtime
reference outputs for batch 2 and 5 in the ONNX test layout (test_data_set_K/{input,output}_0.pb).
Records the producing tools' versions in versions.txt. Usage: make_demo_model.py OUT_DIR"""
import os
import sys

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(2026)

    def weight(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        weight("c1.w", (8, 3, 3, 3), 0.3), weight("c1.b", (8,), 0.1),
        weight("c2.w", (16, 8, 3, 3), 0.2), weight("c2.b", (16,), 0.1),
        weight("fc.w", (10, 16), 0.3), weight("fc.b", (10,), 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "c1.w", "c1.b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "c2.w", "c2.b"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "demo_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="kiln-demo")
    model.ir_version = 9
    onnx.checker.check_model(model)
    path = os.path.join(out_dir, "model.onnx")
    onnx.save(model, path)

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    for k, batch in enumerate((2, 5)):
        x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
        (y,) = session.run(None, {"image": x})
        case = os.path.join(out_dir, f"test_data_set_{k}")
        os.makedirs(case, exist_ok=True)
        with open(os.path.join(case, "input_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(x, "image").SerializeToString())
        with open(os.path.join(case, "output_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(y, "probs").SerializeToString())
    with open(os.path.join(out_dir, "versions.txt"), "w") as f:
        f.write(f"onnx {onnx.__version__}\nonnxruntime {onnxruntime.__version__}\nnumpy {np.__version__}\n")
    print(f"demo model written to {path} (references from onnxruntime {onnxruntime.__version__})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "models/generated/demo_cnn")
