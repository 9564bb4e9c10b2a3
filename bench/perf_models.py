#!/usr/bin/env python3
"""The models of scripts/gpu_perf.sh, made once and shared by kiln's and PyTorch's side: ResNet-50,
MobileNetV3-Large and ViT-B/16 (torchvision) and BERT-base at sequence 128 (transformers), with the
zoo's seeded random weights (scripts/zoo.py: nothing is downloaded).

  python3 bench/perf_models.py export OUT_DIR [NAME...]  # OUT_DIR/NAME.onnx, dynamic batch, + NAME.json
"""
import json
import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import zoo  # noqa: E402

# name: (zoo model, input name, input shape without the batch, CNN (channels-last helps the peer))
PERF = {
    "resnet50": ("resnet50", "x", (3, 224, 224), True),
    "mobilenet_v3_large": ("mobilenet_v3_large", "x", (3, 224, 224), True),
    "vit_b_16": ("vit_b_16", "x", (3, 224, 224), False),
    "bert_base_s128": ("bert_base", "input_ids", (128,), False),
}
MAX_BATCH = 64


def make(name):
    """The torch module (eval, CPU, FP32) and an example input of batch 1."""
    import torch

    zoo_name, _, shape, _ = PERF[name]
    how, spec = zoo.MODELS[zoo_name]
    model = zoo.make_model(how, spec).eval()
    example = torch.from_numpy(zoo.sample(spec, (1,) + shape, 0))
    return model, example


def export(out_dir, names=None):
    import torch

    warnings.filterwarnings("ignore")
    os.makedirs(out_dir, exist_ok=True)
    for name, (_, input_name, shape, _) in PERF.items():
        if names and name not in names:
            continue
        path = os.path.join(out_dir, name + ".onnx")
        if os.path.exists(path):
            continue
        model, example = make(name)
        # The TorchScript exporter at opset 17: every zoo model of these four builds from it.
        torch.onnx.export(model, (example.repeat((2,) + (1,) * len(shape)),), path, dynamo=False,
                          opset_version=17, input_names=[input_name], output_names=["out"],
                          dynamic_axes={input_name: {0: "batch"}})
        with open(os.path.join(out_dir, name + ".json"), "w") as f:
            json.dump(dict(input=input_name, shape=list(shape)), f)
        print(f"exported {name} to {path}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "export" or any(n not in PERF for n in sys.argv[3:]):
        sys.exit(__doc__)
    export(sys.argv[2], sys.argv[3:])
