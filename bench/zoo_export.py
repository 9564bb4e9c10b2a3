"""Exports the model zoo of scripts/gpu_zoo.sh on the GPU host: real architectures from
torchvision and transformers with seeded random weights (nothing is downloaded), each with a
dynamic batch, through torch.onnx.export as a new user would call it (the dynamo exporter, opset
18). Usage: zoo_export.py OUT_DIR [NAME ...]. Writes OUT_DIR/NAME.onnx and prints one line per
model: "NAME exported INPUT_SPEC" (the input's name and shape at batch 1) or "NAME failed: why".
Exports run in parallel processes (export is CPU-bound)."""
import os
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor


def realistic(model):
    """Seeded weights that keep activations near unit scale, as trained ones do: torchvision's
    fresh init zeroes some heads (ViT, GoogLeNet) and leaves others' logits near 1e-9
    (MobileNetV3, EfficientNet), which no comparison can judge. Linear weights ~ N(0, 1/fan_in);
    norms get scales near 1, shifts near 0 and running variances in [0.5, 1.5]."""
    import torch

    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.in_features ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
            elif isinstance(m, (torch.nn.BatchNorm2d, torch.nn.LayerNorm, torch.nn.GroupNorm)):
                if getattr(m, "weight", None) is not None:
                    m.weight.copy_(1 + 0.1 * torch.randn(m.weight.shape, generator=g))
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                    m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return model


def image(name, batch=2):
    import torch
    import torchvision

    torch.manual_seed(0)
    model = realistic(getattr(torchvision.models, name)(weights=None)).eval()
    return model, (torch.randn(batch, 3, 224, 224),), "x"


def bert(batch=2):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072)
    model = BertModel(cfg).eval()
    return model, (torch.randint(0, 30522, (batch, 128)),), "input_ids"


def gpt2(batch=2):
    import torch
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    model = GPT2Model(GPT2Config(n_layer=12, n_embd=768, n_head=12, use_cache=False)).eval()
    return model, (torch.randint(0, 50257, (batch, 128)),), "input_ids"


MODELS = {
    "resnet50": lambda: image("resnet50"),
    "mobilenet_v3_large": lambda: image("mobilenet_v3_large"),
    "efficientnet_b0": lambda: image("efficientnet_b0"),
    "densenet121": lambda: image("densenet121"),
    "convnext_tiny": lambda: image("convnext_tiny"),
    "regnet_y_400mf": lambda: image("regnet_y_400mf"),
    "shufflenet_v2_x1_0": lambda: image("shufflenet_v2_x1_0"),
    "squeezenet1_1": lambda: image("squeezenet1_1"),
    "googlenet": lambda: image("googlenet"),
    "resnext50_32x4d": lambda: image("resnext50_32x4d"),
    "vit_b_16": lambda: image("vit_b_16"),
    "swin_t": lambda: image("swin_t"),
    "bert_base": bert,
    "gpt2": gpt2,
}


def export(args):
    name, out_dir = args
    path = os.path.join(out_dir, name + ".onnx")
    try:
        import torch

        torch.set_num_threads(2)
        warnings.filterwarnings("ignore")
        model, example, input_name = MODELS[name]()
        shape = list(example[0].shape)
        if not os.path.exists(path):
            batch = torch.export.Dim("batch", min=1, max=64)
            kwargs = dict(input_names=[input_name], opset_version=18, dynamo=True,
                          dynamic_shapes=({0: batch},))
            if name == "googlenet":  # its aux logits run only in training
                model.aux_logits = False
            torch.onnx.export(model, example, path, **kwargs)
        # The input the comparison runs on, at batch 4 (token ids inside the vocabulary).
        import numpy as np

        if example[0].dtype == torch.int64:
            sample = torch.randint(0, 1000, (4, *shape[1:]))
        else:
            sample = torch.randn(4, *shape[1:])
        np.save(os.path.join(out_dir, name + ".input.npy"), sample.numpy())
        shape[0] = 1
        return f"{name} exported {input_name}:{'x'.join(map(str, shape))}"
    except Exception as e:  # report and go on: one model's exporter failure is not the zoo's
        msg = str(e).strip().splitlines()
        return f"{name} failed: {type(e).__name__}: {msg[0][:300] if msg else ''}"


def main():
    out_dir = sys.argv[1]
    names = sys.argv[2:] or list(MODELS)
    os.makedirs(out_dir, exist_ok=True)
    with ProcessPoolExecutor(max_workers=min(8, len(names))) as pool:
        for line in pool.map(export, [(n, out_dir) for n in names]):
            print(line, flush=True)


if __name__ == "__main__":
    main()
