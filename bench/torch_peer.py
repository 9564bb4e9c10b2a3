"""PyTorch eager peer for gpu_bench: the same architectures as the shared models (torchvision
MobileNetV3-small and the 4-layer ViT of make_models.py), on the GPU, inputs resident, FP32 with
TF32 off and on, and FP16 autocast. Prints lines in gpu_bench's format."""
import sys, time
import torch, torchvision
from torchvision.models.vision_transformer import VisionTransformer

iters = int(sys.argv[1]) if len(sys.argv) > 1 else 200
dev = torch.device("cuda")
models = {
    "mobilenet_v3_small": torchvision.models.mobilenet_v3_small(num_classes=1000),
    "vit_tiny": VisionTransformer(image_size=224, patch_size=16, num_layers=4, num_heads=3, hidden_dim=192, mlp_dim=768),
}
for name, m in models.items():
    m = m.to(dev).eval()
    for prec in ("fp32", "tf32", "fp16"):
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        torch.backends.cudnn.allow_tf32 = prec == "tf32"
        for batch in (1, 8):
            x = torch.randn(batch, 3, 224, 224, device=dev)
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=prec == "fp16"):
                for _ in range(10):
                    m(x)
                torch.cuda.synchronize()
                ts = []
                for _ in range(iters):
                    t0 = time.perf_counter()
                    m(x)
                    torch.cuda.synchronize()
                    ts.append((time.perf_counter() - t0) * 1e3)
            ts.sort()
            print(f"torch {name:<19} {prec:<5} batch {batch:2d} eager    median {ts[len(ts)//2]:8.3f} ms  min {ts[0]:8.3f} ms", flush=True)
