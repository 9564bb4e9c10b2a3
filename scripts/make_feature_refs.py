#!/usr/bin/env python3
"""Makes feature-level references for the shared classifiers whose logits are degenerate.

The shared vit_tiny, vit_tiny_legacy and mobilenet_v3_small models have heads that map any input
to (near) zero logits (zero-initialised heads), so matching their reference outputs proves little.
This script marks every float intermediate as an output (as polygraphy's `mark all` does), runs
ONNX Runtime (CPU, FP32) once on seeded inputs at batch 3, and keeps as an extra graph output the
deepest intermediate whose values carry signal (standard deviation > 1e-2): it depends on every layer before
it. It writes model.onnx + test_data_set_0 in the ONNX test layout.
Usage: make_feature_refs.py SHARED_MODELS_DIR OUT_DIR"""
import os
import sys

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

MODELS = ("vit_tiny", "vit_tiny_legacy", "mobilenet_v3_small")


def deepest_signal(model: onnx.ModelProto, x: np.ndarray) -> str:
    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    existing = {o.name for o in marked.graph.output}
    names = [o for n in marked.graph.node for o in n.output if o and o not in existing]
    for o in names:
        marked.graph.output.append(onnx.ValueInfoProto(name=o))
    session = onnxruntime.InferenceSession(marked.SerializeToString(), providers=["CPUExecutionProvider"])
    values = session.run(names, {session.get_inputs()[0].name: x})
    for name, v in reversed(list(zip(names, values))):
        if v.dtype == np.float32 and v.size >= 16 and v.std() > 1e-2:
            return name
    raise SystemExit("no intermediate with signal")


def main(shared: str, out: str) -> None:
    for name in MODELS:
        src = os.path.join(shared, name, "model.onnx")
        if not os.path.exists(src):
            print(f"make_feature_refs: {src} absent, skipped")
            continue
        model = onnx.load(src)
        x = np.random.default_rng(11).standard_normal((3, 3, 224, 224)).astype(np.float32)
        feature = deepest_signal(model, x)
        model.graph.output.append(onnx.ValueInfoProto(name=feature))
        dst = os.path.join(out, name)
        os.makedirs(os.path.join(dst, "test_data_set_0"), exist_ok=True)
        path = os.path.join(dst, "model.onnx")
        onnx.save(model, path)
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        input_name = session.get_inputs()[0].name
        outputs = session.run(None, {input_name: x})
        case = os.path.join(dst, "test_data_set_0")
        with open(os.path.join(case, "input_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(x, input_name).SerializeToString())
        for i, y in enumerate(outputs):
            with open(os.path.join(case, f"output_{i}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(y).SerializeToString())
        print(f"make_feature_refs: {name}: feature '{feature}' {outputs[-1].shape}, "
              f"max|e| {np.abs(outputs[-1]).max():.3g} (onnxruntime {onnxruntime.__version__})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
