#!/usr/bin/env python3
"""The models of scripts/gpu_perf.sh, made once and shared by kiln's and PyTorch's side: ResNet-50,
MobileNetV3-Large, ViT-B/16 and Swin-T (torchvision), BERT-base and DistilBERT at sequence 128 and
GPT-2 small at sequence 256 (transformers), and BERT-base with a dynamic sequence for the
dynamic-shape check, with the zoo's seeded random weights (scripts/zoo.py: nothing is downloaded).

  python3 bench/perf_models.py export OUT_DIR [NAME...]  # OUT_DIR/NAME.onnx, dynamic batch, + NAME.json

A NAME is a model of PERF, exported as most of kiln's users had it until torch 2.9 (the TorchScript
exporter, `dynamo=False`, opset 17), or NAME-dynamo: the same module through torch's default today,
`torch.onnx.export(dynamo=True)` at opset 18 with a dynamic batch (torch.export.Dim). PyTorch's
side times the module itself, so both exports share one peer.

NAME.json: input (name), shape (without the batch: the shape timed), max_batch (the profile is
batch 1..max_batch, opt max_batch), batches (the batches timed), and for the models of SEQ_PROFILE
seq_profile [min, opt, max] (sequence dynamic in the ONNX model; batch fixed at max_batch there).
"""
import json
import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import zoo  # noqa: E402

# name: (zoo model, input name, input shape without the batch, CNN (channels-last helps the peer),
# max batch)
PERF = {
    "resnet50": ("resnet50", "x", (3, 224, 224), True, 64),
    "mobilenet_v3_large": ("mobilenet_v3_large", "x", (3, 224, 224), True, 64),
    # The two CNNs issue 35 names beside them, at batch 32; EfficientNetV2-S at its own 384 pixels.
    "convnext_tiny": ("convnext_tiny", "x", (3, 224, 224), True, 32),
    "efficientnet_v2_s": ("efficientnet_v2_s", "x", (3, 384, 384), True, 32),
    "vit_b_16": ("vit_b_16", "x", (3, 224, 224), False, 32),
    "swin_t": ("swin_t", "x", (3, 224, 224), False, 32),
    "swin_v2_t": ("swin_v2_t", "x", (3, 256, 256), False, 32),
    "bert_base_s128": ("bert_base", "input_ids", (128,), False, 32),
    "distilbert_s128": ("distilbert", "input_ids", (128,), False, 32),
    "gpt2": ("gpt2", "input_ids", (256,), False, 32),
    "llama_s256": ("llama", "input_ids", (256,), False, 32),
    "whisper_tiny_encoder": ("whisper_tiny_encoder", "input_features", (80, 3000), False, 32),
    "bert_base_dyn": ("bert_base", "input_ids", (384,), False, 8),
}
# Models exported with a dynamic sequence too: the sequence range (min, opt, max) of the engine that
# spans it, timed at the model's shape against an engine built for that shape alone (gpu_perf.sh).
SEQ_PROFILE = {"bert_base_dyn": (16, 128, 512)}


EXPORTERS = ("torchscript", "dynamo")


def split_name(name):
    """(model of PERF, exporter) of a NAME: "bert_base_s128-dynamo" -> ("bert_base_s128", "dynamo")."""
    if name.endswith("-dynamo"):
        return name[: -len("-dynamo")], "dynamo"
    return name, "torchscript"


def known(name):
    base, exporter = split_name(name)
    return base in PERF and (exporter == "torchscript" or base not in SEQ_PROFILE)


def batches(name):
    """The batches timed: 1 and the max batch; a dynamic-sequence model only at its fixed batch."""
    name = split_name(name)[0]
    max_batch = PERF[name][4]
    return [max_batch] if name in SEQ_PROFILE else [1, max_batch]


def make(name):
    """The torch module (eval, CPU, FP32) and an example input of batch 1."""
    import torch

    zoo_name, _, shape, _, _ = PERF[split_name(name)[0]]
    how, spec = zoo.MODELS[zoo_name]
    model = zoo.make_model(how, spec).eval()
    example = torch.from_numpy(zoo.sample(spec, (1,) + shape, 0))
    return model, example


def exportable(name, model):
    """The module torch.onnx.export traces. GPT-2 is given an all-ones attention_mask: without one,
    transformers (5.x) derives position_ids and checks them for packed sequences with torch.diff,
    which the TorchScript exporter cannot export (aten::diff) and the dynamo exporter writes out as
    a CumSum/GatherND mask. With it, the graph is the usual one: Split of the QKV projection,
    Transpose into heads, an additive causal mask (Where of the boolean mask) and Softmax. The
    output is the same (the mask masks nothing); PyTorch's side runs the model without it."""
    import torch

    if split_name(name)[0] not in ("gpt2", "llama_s256"):
        return model

    class OnesMask(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m.m(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).last_hidden_state

    return OnesMask(model).eval()


def export(out_dir, names=None):
    import torch

    warnings.filterwarnings("ignore")
    os.makedirs(out_dir, exist_ok=True)
    for name in names or list(PERF):
        base, exporter = split_name(name)
        _, input_name, shape, _, max_batch = PERF[base]
        path = os.path.join(out_dir, name + ".onnx")
        meta = dict(input=input_name, shape=list(shape), max_batch=max_batch, batches=batches(name),
                    exporter=exporter, peer=base)
        axes = {0: "batch"}
        if base in SEQ_PROFILE:
            meta["seq_profile"] = list(SEQ_PROFILE[base])
            axes[1] = "seq"
        if not os.path.exists(path):
            model, example = make(base)
            example = example.repeat((2,) + (1,) * len(shape))
            if exporter == "dynamo":
                # torch's default exporter, as a user calls it today: a dynamic batch, opset 18.
                dims = ({0: torch.export.Dim("batch", min=1, max=max_batch)},)
                torch.onnx.export(exportable(base, model), (example,), path, dynamo=True, opset_version=18,
                                  input_names=[input_name], output_names=["out"], dynamic_shapes=dims,
                                  external_data=False, verbose=False)
            else:
                # The TorchScript exporter at opset 17 (GPT-2 with the attention_mask of exportable()).
                torch.onnx.export(exportable(base, model), (example,), path, dynamo=False, opset_version=17,
                                  input_names=[input_name], output_names=["out"], dynamic_axes={input_name: axes})
            print(f"exported {name} ({exporter}) to {path}", flush=True)
        with open(os.path.join(out_dir, name + ".json"), "w") as f:
            json.dump(meta, f)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "export" or not all(known(n) for n in sys.argv[3:]):
        sys.exit(__doc__)
    export(sys.argv[2], sys.argv[3:])
