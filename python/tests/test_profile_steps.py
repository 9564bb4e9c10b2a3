# Profiles with steps on a real FPN (issue 15): five stride-2 stages, nearest 2x upsampling and
# lateral adds, valid only where H and W are multiples of 32. Over H, W in 64..960 the build is
# refused; with steps of 32 it builds, runs 1x3x96x640 and 2x3x640x320 matching ONNX Runtime, and
# refuses 1x3x100x640 naming the step. Skipped without PyTorch or ONNX Runtime.
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install '.[torch]')")
ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is not installed")

import kiln  # noqa: E402


class Fpn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        ch = [3, 8, 16, 16, 32, 32]
        self.down = torch.nn.ModuleList(torch.nn.Conv2d(ch[i], ch[i + 1], 3, stride=2, padding=1) for i in range(5))
        self.lateral = torch.nn.ModuleList(torch.nn.Conv2d(ch[i + 1], 16, 1) for i in range(5))

    def forward(self, x):
        feats = []
        for conv in self.down:
            x = torch.relu(conv(x))
            feats.append(x)
        top = self.lateral[4](feats[4])
        for i in (3, 2, 1, 0):
            top = torch.nn.functional.interpolate(top, scale_factor=2.0, mode="nearest") + self.lateral[i](feats[i])
        return top


@pytest.fixture(scope="module")
def fpn_onnx(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("fpn") / "fpn.onnx"
    torch.onnx.export(Fpn().eval(), (torch.randn(1, 3, 96, 640),), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}}, opset_version=17, dynamo=False)
    return path


def build(path, steps):
    profile = kiln.OptimizationProfile()
    profile.set_dimensions("x", (1, 3, 64, 64), (1, 3, 96, 640), (2, 3, 960, 960), steps=steps)
    config = kiln.BuilderConfig()
    config.clear_flag(kiln.BuilderFlag.TF32)
    config.add_profile(profile)
    return kiln.Builder().build(kiln.onnx.parse_file(path), config)


def test_fpn_builds_on_steps_of_32_and_matches_onnxruntime(fpn_onnx):
    with pytest.raises(kiln.InvalidArgumentError, match=r"2\*ceil\(h/32\) must broadcast with ceil\(h/16\).*"
                                                         r"a profile that steps h by 32 from 64 would build"):
        build(fpn_onnx, None)
    engine = build(fpn_onnx, (1, 1, 32, 32))
    context = engine.create_execution_context()
    session = ort.InferenceSession(str(fpn_onnx), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for shape in [(1, 3, 96, 640), (2, 3, 640, 320)]:
        x = rng.standard_normal(shape, dtype=np.float32)
        got = context.run({"x": x})["y"]
        want = session.run(None, {"x": x})[0]
        assert got.shape == want.shape == (shape[0], 16, shape[2] // 2, shape[3] // 2)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
    with pytest.raises(kiln.InvalidArgumentError,
                       match=r"dim 2 .* = 100 .*steps of 32 \(the nearest values are 96 and 128\)"):
        context.set_input_shape("x", (1, 3, 100, 640))
