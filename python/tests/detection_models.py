"""torchvision's detection models as ONNX, the way their users export them (issue 15, item 8).

ssdlite320_mobilenet_v3_large and fasterrcnn_mobilenet_v3_large_320_fpn with seeded random
weights, exported by torch.onnx's TorchScript exporter (the one torchvision's own ONNX tests use)
at opset 17 with the image's H and W dynamic. torchvision runs its post-processing once per image
of the input list, so the exporter unrolls it: a model is exported per batch size, its input
`images` [batch, 3, height, width] split into the list inside the graph.

Untrained heads give every box the same score (1/91), so ties would decide the order: the weights
are re-drawn (normal, variance gain/fan_in, small biases; Faster R-CNN's second stage with a small
gain so its scores do not saturate) so that scores differ, and the score thresholds keep a number
of boxes that depends on the image (about 100 for SSD, 20 to 70 for Faster R-CNN).

The graphs hold what makes detectors hard for an engine builder: NonZero and TopK sized by the
data, NonMaxSuppression, an If on data (torchvision's batched_nms returns early for no boxes),
RoiAlign over FPN levels chosen per box, and (Faster R-CNN) a resize whose output size is computed
in float from the input's H and W.
"""
import math

MODELS = ("ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn")


def _redraw(module, seed, gain=2.0):
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * math.sqrt(gain / fan_in))
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)


def make_model(name):
    import torch
    from torchvision.models import detection
    torch.manual_seed(0)
    if name == "ssdlite320_mobilenet_v3_large":
        model = detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=91,
                                                        score_thresh=0.97)
        _redraw(model, 0)
    elif name == "fasterrcnn_mobilenet_v3_large_320_fpn":
        model = detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None,
                                                                num_classes=91, box_score_thresh=0.2)
        _redraw(model.backbone, 0)
        _redraw(model.roi_heads, 1, gain=0.1)
    else:
        raise ValueError(f"unknown model {name}")
    return model.eval()


def output_names(batch):
    return [f"{k}_{i}" for i in range(batch) for k in ("boxes", "scores", "labels")]


def export(name, batch, path):
    """Writes the model for `batch` images to `path`; returns the output names."""
    import torch

    class Batched(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, images):
            out = []
            for d in self.model(list(images)):
                out += [d["boxes"], d["scores"], d["labels"]]
            return tuple(out)

    names = output_names(batch)
    wrapped = Batched(make_model(name)).eval()
    x = torch.rand(batch, 3, 320, 320, generator=torch.Generator().manual_seed(7))
    dynamic = {"images": {2: "height", 3: "width"}}
    dynamic.update({n: {0: f"count_{n}"} for n in names})
    with torch.no_grad():
        torch.onnx.export(wrapped, (x,), str(path), input_names=["images"], output_names=names,
                          dynamic_axes=dynamic, opset_version=17, dynamo=False)
    return names


if __name__ == "__main__":
    import argparse
    import warnings
    p = argparse.ArgumentParser(description="export torchvision's detection models to ONNX")
    p.add_argument("model", choices=MODELS)
    p.add_argument("batch", type=int)
    p.add_argument("path")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    export(a.model, a.batch, a.path)
    print(a.path)
