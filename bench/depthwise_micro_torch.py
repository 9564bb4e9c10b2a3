"""cuDNN's depthwise convolution through torch (F.conv2d, channels-last float16, groups = C), alone and
with its HardSwish, at bench/depthwise_micro.cu's shapes: the peer of those kernel forms. CUDA events,
median of 15 repetitions of 20 calls, cudnn.benchmark on.

    python3 bench/depthwise_micro_torch.py
"""
import torch
import torch.nn.functional as F

torch.backends.cudnn.benchmark = True
# (batch, channels, height = width, kernel, stride), depthwise_micro.cu's layers in its order.
L = [(64, 16, 112, 3, 1), (64, 64, 112, 3, 2), (64, 72, 56, 3, 1), (64, 72, 56, 5, 2), (64, 120, 28, 5, 1),
     (64, 240, 28, 3, 2), (64, 200, 14, 3, 1), (64, 184, 14, 3, 1), (64, 480, 14, 3, 1), (64, 672, 14, 3, 1),
     (64, 672, 14, 5, 2), (64, 960, 7, 5, 1), (32, 256, 48, 3, 2), (32, 512, 24, 3, 1), (32, 768, 24, 3, 1),
     (32, 960, 24, 3, 1), (32, 960, 24, 3, 2), (32, 1536, 12, 3, 1)]


def median_us(f):
    """Median microseconds a call over 15 repetitions of 20 calls, after 30 warm-up calls."""
    for _ in range(30):
        f()
    ts = []
    for _ in range(15):
        a, e = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        for _ in range(20):
            f()
        e.record()
        e.synchronize()
        ts.append(a.elapsed_time(e) * 1000 / 20)
    return sorted(ts)[len(ts) // 2]


for n, c, h, k, s in L:
    x = torch.randn(n, c, h, h, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
    w = torch.randn(c, 1, k, k, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
    b = torch.randn(c, device="cuda", dtype=torch.half)
    forms = (("conv", lambda: F.conv2d(x, w, b, s, k // 2, 1, c)),
             ("conv+hardswish", lambda: F.hardswish(F.conv2d(x, w, b, s, k // 2, 1, c))))
    for name, f in forms:
        us = median_us(f)
        mb = (x.numel() + f().numel()) * 2 / 1e6
        print(f"n{n} c{c} h{h} k{k} s{s}  {mb:.1f} MB  torch {name} {us:.1f} us ({mb / us:.2f} TB/s)", flush=True)
