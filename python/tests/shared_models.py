"""The profiles of ../shared/models/README.md, one table for the tests (conftest.py) and the CPU
benchmark (bench/cpu_peer.py): model -> input -> (min, opt, max)."""

PROFILES = {
    "mobilenet_v3_small": {"x": ((1, 3, 224, 224), (4, 3, 224, 224), (32, 3, 224, 224))},
    "vit_tiny": {"x": ((1, 3, 224, 224), (4, 3, 224, 224), (32, 3, 224, 224))},
    "vit_tiny_legacy": {"input": ((1, 3, 224, 224), (4, 3, 224, 224), (32, 3, 224, 224))},
    "unet_pixelshuffle": {"x": ((1, 3, 200, 200), (1, 3, 300, 300), (32, 3, 400, 400))},
    "testmod_linear": {"x": ((1, 1, 16), (4, 4, 16), (10, 10, 16))},
    "llama_tiny": {"ids": ((1, 2), (2, 32), (8, 128))},
}
