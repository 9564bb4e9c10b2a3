# Two small networks trained at test time on scikit-learn's bundled digits (1,797 8x8 images, no
# download): a CNN and a one-block transformer over the image's 8 rows as tokens, exported to ONNX
# with a dynamic batch. Calibration reads 200 of the training images (as TensorRT advises: a
# representative subset of the training data); accuracy is judged on the 597 images after them,
# which training never saw.
import numpy as np

TRAIN, CALIB, HOLDOUT = slice(0, 1200), slice(1000, 1200), slice(1200, None)


def digits():
    """(images (N, 1, 8, 8) float32 in [0, 1], labels (N,) int64), in sklearn's fixed order."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images / 16.0).astype(np.float32)[:, None], d.target.astype(np.int64)


def _cnn(torch):
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(32, 32, 3, padding=1, groups=4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


def _transformer(torch):
    nn = torch.nn

    class PatchTransformer(nn.Module):
        """Each 2x2 patch a token (16 of them): embedding, one pre-norm attention block, an MLP, a head."""

        def __init__(self, d=32, heads=4):
            super().__init__()
            self.heads = heads
            self.embed = nn.Linear(4, d)
            self.pos = nn.Parameter(torch.randn(16, d) * 0.1)
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Linear(64, d))
            self.head = nn.Linear(d, 10)

        def forward(self, x):
            b = x.shape[0]
            patches = x.reshape(b, 4, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(b, 16, 4)
            t = self.embed(patches) + self.pos
            q, k, v = self.qkv(self.norm1(t)).reshape(b, 16, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5), dim=-1)
            t = t + self.proj((att @ v).transpose(1, 2).reshape(b, 16, -1))
            t = t + self.mlp(self.norm2(t))
            return self.head(t.mean(dim=1))

    return PatchTransformer()


def trained_onnx(kind, path, dynamo):
    """Trains the network on the first 1,200 digits and writes it to ``path``; its held-out accuracy."""
    import torch

    torch.manual_seed(0)
    x, y = digits()
    xt, yt = torch.from_numpy(x[TRAIN]), torch.from_numpy(y[TRAIN])
    model = _cnn(torch) if kind == "cnn" else _transformer(torch)
    steps_per_epoch, epochs = (len(xt) + 49) // 50, 60
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=5e-2)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=epochs * steps_per_epoch)
    for _ in range(epochs):
        order = torch.randperm(len(xt))
        for i in range(0, len(xt), 50):
            batch = order[i:i + 50]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xt[batch]), yt[batch]).backward()
            opt.step()
            schedule.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(torch.from_numpy(x[HOLDOUT])).argmax(1) == torch.from_numpy(y[HOLDOUT])).float().mean())
    example = (torch.from_numpy(x[:2]),)
    if dynamo:
        torch.onnx.export(model, example, str(path), input_names=["image"], output_names=["logits"], dynamo=True,
                          dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=1024)}})
    else:
        torch.onnx.export(model, example, str(path), input_names=["image"], output_names=["logits"], dynamo=False,
                          opset_version=17, dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    return accuracy
