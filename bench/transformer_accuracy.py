#!/usr/bin/env python3
"""The transformer accuracy check of scripts/gpu.sh (part "accuracy"): the fused CUDA engines of
BERT-base and GPT-2 small, given real padding masks, and ViT-B/16, against ONNX Runtime FP32.

  python3 bench/transformer_accuracy.py export OUT_DIR   # OUT_DIR/NAME.onnx, inputs, NAME.json

BERT-base and GPT-2 are exported (the zoo's seeded random weights, scripts/zoo.py; TorchScript
exporter, opset 17) with two inputs, input_ids and attention_mask, both [batch, seq] with batch and
sequence dynamic, so the attention mask is data the engine reads: BERT's padding mask and GPT-2's
causal mask combined with it. The inputs are batch 4 at sequence 128 with the rows padded on the
right to lengths 128, 96, 37 and 1 (mask 1 for a real token, 0 for padding; no row is all padding,
so every query has a key to attend to and the reference's output is defined everywhere). ViT-B/16
has no mask: batch 2 of seeded normal images.

NAME.json: inputs (name -> .npy file), the profile the engine spans (min, opt, max per input, the
timed shape inside it) and the lengths. scripts/gpu.sh runs `kiln compare --loadInputs` on each
(FP16, BF16 and strict FP32) and prints the cosine and max error per output.
"""
import json
import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import zoo  # noqa: E402

LENGTHS = [128, 96, 37, 1]
SEQ = 128


def with_mask(model):
    """The module the exporter traces: the zoo's model called with input_ids and attention_mask."""
    import torch

    class WithMask(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return WithMask(model).eval()


def text_inputs(seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 1000, size=(len(LENGTHS), SEQ), dtype=np.int64)
    mask = np.zeros((len(LENGTHS), SEQ), dtype=np.int64)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask}


def export(out_dir):
    import numpy as np
    import torch

    warnings.filterwarnings("ignore")
    os.makedirs(out_dir, exist_ok=True)
    for name in ["bert_base", "gpt2"]:
        path = os.path.join(out_dir, name + "_mask.onnx")
        how, spec = zoo.MODELS[name]
        inputs = text_inputs(3)
        if not os.path.exists(path):
            model = with_mask(zoo.make_model(how, spec))
            example = tuple(torch.from_numpy(inputs[k][:2, :16].copy()) for k in ["input_ids", "attention_mask"])
            axes = {0: "batch", 1: "seq"}
            torch.onnx.export(model, example, path, dynamo=False, opset_version=17,
                              input_names=["input_ids", "attention_mask"], output_names=["out"],
                              dynamic_axes={"input_ids": axes, "attention_mask": axes})
            print(f"exported {name} (input_ids, attention_mask) to {path}", flush=True)
        files = {}
        for k, v in inputs.items():
            files[k] = os.path.join(out_dir, f"{name}_mask.{k}.npy")
            np.save(files[k], v)
        b = len(LENGTHS)
        profile = {k: [[1, 16], [b, SEQ], [8, 512]] for k in inputs}
        with open(os.path.join(out_dir, name + "_mask.json"), "w") as f:
            json.dump(dict(model=path, inputs=files, profile=profile, lengths=LENGTHS), f)
    # ViT-B/16: no mask, the fused engine's packed attention on images.
    path = os.path.join(out_dir, "vit_b_16.onnx")
    how, spec = zoo.MODELS["vit_b_16"]
    if not os.path.exists(path):
        model = zoo.make_model(how, spec)
        example = torch.from_numpy(zoo.sample(spec, (2, 3, 224, 224), 0))
        torch.onnx.export(model, (example,), path, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["out"], dynamic_axes={"x": {0: "batch"}})
        print(f"exported vit_b_16 to {path}", flush=True)
    x = os.path.join(out_dir, "vit_b_16.x.npy")
    np.save(x, zoo.sample(spec, (2, 3, 224, 224), 5))
    with open(os.path.join(out_dir, "vit_b_16.json"), "w") as f:
        json.dump(dict(model=path, inputs={"x": x}, profile={"x": [[1, 3, 224, 224], [2, 3, 224, 224], [8, 3, 224, 224]]},
                       lengths=[]), f)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "export":
        sys.exit(__doc__)
    export(sys.argv[2])
