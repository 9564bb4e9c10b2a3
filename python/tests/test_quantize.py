# kiln.quantize on networks trained at test time (digits_models.py): INT8 from each calibration
# method keeps the FP32 engine's top-1 on >= 99% of held-out digits, the QDQ model kiln runs is
# what ONNX Runtime computes from it, ONNX Runtime's own quantize_static model runs the same in
# kiln, FP8 models are written for runtimes that take them, the accuracy budget moves layers to
# float until it holds, and bad calibration input is refused with the reason.
import json
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import kiln
import kiln.quantize as kq

pytest.importorskip("sklearn", reason="scikit-learn (the digits set) is not installed: pip install -r requirements-torch.txt")
pytest.importorskip("torch", reason="torch is not installed: pip install -r requirements-torch.txt")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from digits_models import CALIB, HOLDOUT, digits, trained_onnx  # noqa: E402

MODELS = [("cnn", False), ("transformer", True)]  # the CNN through the TorchScript exporter, the transformer dynamo


@pytest.fixture(scope="module")
def data():
    return digits()


@pytest.fixture(scope="module", params=MODELS, ids=[f"{k}-{'dynamo' if d else 'torchscript'}" for k, d in MODELS])
def model(request, tmp_path_factory):
    kind, dynamo = request.param
    path = tmp_path_factory.mktemp(kind) / f"{kind}.onnx"
    accuracy = trained_onnx(kind, path, dynamo)
    print(f"{kind}: {accuracy:.4f} of the held-out digits right in FP32 (torch)")
    assert accuracy > 0.9, f"{kind} reaches only {accuracy:.3f} on held-out digits"
    return path


def model_bytes(path):
    """The model with its external data (the dynamo exporter writes weights beside the file)."""
    return onnx.load(str(path)).SerializeToString()


def feeds(x, batch):
    return [{"image": x[i:i + batch]} for i in range(0, len(x), batch)]


def engine_of(model_bytes, max_batch=64):
    config = kiln.BuilderConfig()
    profile = kiln.OptimizationProfile()
    profile.set_dimensions("image", (1, 1, 8, 8), (max_batch, 1, 8, 8), (max_batch, 1, 8, 8))
    config.add_profile(profile)
    return kiln.Builder(kiln.Device.CPU).build(kiln.onnx.parse_bytes(model_bytes), config)


def logits(engine, x, batch=64):
    context = engine.create_execution_context()
    return np.concatenate([context.run({"image": x[i:i + batch]})["logits"] for i in range(0, len(x), batch)])


def ort_logits(model_bytes, x, optimize):
    options = ort.SessionOptions()
    if not optimize:  # ONNX's own meaning of each node, Q and DQ unfused
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"image": x})[0]


@pytest.fixture(scope="module")
def fp32(model, data):
    x, _ = data
    return logits(engine_of(model_bytes(model)), x[HOLDOUT])


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_int8_keeps_top1_of_fp32(model, data, fp32, method):
    x, _ = data
    calib = kq.Calibrator(model, method=method).calibrate(feeds(x[CALIB], 8))
    assert calib.samples == 25 and calib.method == method
    assert all(v > 0 for v in calib.amax.values()), calib.amax
    q = kq.quantize(model, calib)
    ops = [n.op_type for n in q.graph.node]
    sites = sum(op in kq.QUANTIZABLE_OPS for op in ops)
    assert ops.count("QuantizeLinear") >= 1 and ops.count("DequantizeLinear") > sites, ops
    int8 = {t.name for t in q.graph.initializer if t.data_type == onnx.TensorProto.INT8 and len(t.dims) >= 2}
    assert int8, "no weight was stored as int8"
    got = logits(engine_of(q.SerializeToString()), x[HOLDOUT])
    agree = float(np.mean(got.argmax(1) == fp32.argmax(1)))
    print(f"{model.stem} {method}: top-1 agreement with FP32 {agree:.4f} on {len(got)} held-out digits")
    assert agree >= 0.99, (method, agree)


def test_calibration_methods_clip_differently(model, data):
    x, _ = data
    f = feeds(x[CALIB], 8)
    amax = {m: kq.Calibrator(model, method=m).calibrate(f).amax for m in ("minmax", "percentile", "entropy")}
    for t, top in amax["minmax"].items():
        assert amax["percentile"][t] <= top * (1 + 1e-6) and amax["entropy"][t] <= top * (1 + 1e-6), t
    assert any(amax["entropy"][t] < 0.99 * top for t, top in amax["minmax"].items()), amax


def test_kiln_runs_the_qdq_model_as_onnxruntime_does(model, data):
    x, _ = data
    q = kq.quantize(model, kq.Calibrator(model, method="entropy").calibrate(feeds(x[CALIB], 8)))
    b = q.SerializeToString()
    got = logits(engine_of(b), x[HOLDOUT][:64])
    want = ort_logits(b, x[HOLDOUT][:64], optimize=False)
    fused = ort_logits(b, x[HOLDOUT][:64], optimize=True)
    err = float(np.max(np.abs(got - want)))
    print(f"{model.stem}: kiln vs ONNX Runtime (unfused QDQ) max |diff| {err:.3g}; ORT fused vs unfused "
          f"{float(np.max(np.abs(fused - want))):.3g}; logits up to {float(np.max(np.abs(want))):.3g}")
    assert np.array_equal(got.argmax(1), want.argmax(1))
    np.testing.assert_allclose(got, want, atol=5e-3, rtol=1e-3)


def test_onnxruntime_quantize_static_model_runs_in_kiln(model, data, tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    x, _ = data

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds(x[CALIB], 8))

        def get_next(self):
            return next(self.it, None)

    out = tmp_path / "ort_qdq.onnx"
    quantize_static(str(model), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    b = out.read_bytes()
    ops = [n.op_type for n in onnx.load_from_string(b).graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    got = logits(engine_of(b), x[HOLDOUT][:64])
    want = ort_logits(b, x[HOLDOUT][:64], optimize=False)
    print(f"{model.stem}: ORT quantize_static model, kiln vs ORT max |diff| {float(np.max(np.abs(got - want))):.3g}")
    assert np.array_equal(got.argmax(1), want.argmax(1))
    np.testing.assert_allclose(got, want, atol=5e-3, rtol=1e-3)


def test_quantized_activations_are_integer_exact(model, data):
    # The int8 tensors themselves: the first QuantizeLinear's input and output as kiln and ORT
    # compute them. Its input is the image or a view of it, so both quantize the same floats, and
    # QuantizeLinear's rounding (half to even) and saturation give the same integers.
    x, _ = data
    q = kq.quantize(model, kq.Calibrator(model, method="minmax").calibrate(feeds(x[CALIB], 8)))
    first_q = next(n for n in q.graph.node if n.op_type == "QuantizeLinear")
    q.graph.output.append(onnx.helper.make_tensor_value_info(first_q.input[0], onnx.TensorProto.FLOAT, None))
    q.graph.output.append(onnx.helper.make_tensor_value_info(first_q.output[0], onnx.TensorProto.INT8, None))
    b = q.SerializeToString()
    xs = x[HOLDOUT][:32]
    names = [first_q.input[0], first_q.output[0]]
    ours = engine_of(b).create_execution_context().run({"image": xs})
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    theirs = ort.InferenceSession(b, options, providers=["CPUExecutionProvider"]).run(names, {"image": xs})
    assert np.array_equal(ours[names[0]], theirs[0]), "the quantized floats differ"
    got = ours[names[1]]
    assert got.dtype == np.int8 and np.array_equal(got, theirs[1])
    assert len(np.unique(got)) > 8, "the quantized image is degenerate"


def test_fp8_model_for_runtimes_that_take_it(model, data, fp32):
    x, _ = data
    q = kq.quantize(model, kq.Calibrator(model, method="minmax").calibrate(feeds(x[CALIB], 8)), precision="fp8")
    fp8 = [t for t in q.graph.initializer if t.data_type == onnx.TensorProto.FLOAT8E4M3FN]
    assert fp8 and max(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) >= 19
    got = ort_logits(q.SerializeToString(), x[HOLDOUT], optimize=False)
    agree = float(np.mean(got.argmax(1) == fp32.argmax(1)))
    print(f"{model.stem} fp8 (run by ONNX Runtime): top-1 agreement with kiln FP32 {agree:.4f}")
    assert agree >= 0.99
    # kiln has no float8 tensors on the CPU yet: the build says so, naming the element type.
    with pytest.raises(kiln.Error, match="(?i)float8"):
        engine_of(q.SerializeToString())


def test_accuracy_budget_moves_the_most_sensitive_layers_to_float(model, data, fp32):
    x, _ = data
    calib = kq.Calibrator(model, method="minmax").calibrate(feeds(x[CALIB], 8))
    holdout = feeds(x[HOLDOUT][:128], 64)
    everything = kq._measure("cosine", [{"logits": logits(engine_of(kq.quantize(model, calib).SerializeToString()),
                                                          x[HOLDOUT][:128])}], [{"logits": fp32[:128]}])
    assert everything < 1.0
    budget = 1.0 - (1.0 - everything) / 4  # all-int8 misses it; all-float meets it
    q, report = kq.quantize_to_budget(model, calib, holdout, f"cosine:{budget}")
    print(f"{model.stem}: cosine {report['all_quantized']:.6f} all int8, budget {budget:.6f}, "
          f"{report['final']:.6f} with {report['moved_to_float']} in float")
    assert report["moved_to_float"] and report["final"] >= budget
    assert set(report["sensitivity"]) >= set(report["moved_to_float"])
    again = logits(engine_of(q.SerializeToString()), x[HOLDOUT][:128])
    measured = kq._measure("cosine", [{"logits": again}], [{"logits": fp32[:128]}])
    assert measured >= budget, (measured, budget)
    meta = json.loads({p.key: p.value for p in q.metadata_props}["kiln.quantization"])
    assert meta["float_nodes"] == sorted(report["moved_to_float"])


def test_bad_calibration_input_is_refused(model, data, tmp_path):
    x, _ = data
    c = kq.Calibrator(model, method="entropy")
    with pytest.raises(kiln.InvalidArgumentError, match="at least one feed"):
        c.calibrate([])
    with pytest.raises(kiln.InvalidArgumentError, match="missing image.*unknown pixels"):
        c.calibrate([{"pixels": x[:2]}])
    bad = x[:4].copy()
    bad[1, 0, 3, 3] = np.nan
    with pytest.raises(kiln.InvalidArgumentError, match="feed 0: input 'image' holds NaN"):
        c.calibrate([{"image": bad}])
    with pytest.raises(kiln.InvalidArgumentError, match="method 'kl'"):
        kq.Calibrator(model, method="kl")
    calib = c.calibrate(feeds(x[CALIB][:16], 8))
    other = onnx.load(str(model))
    other.graph.node[0].name = "renamed"
    with pytest.raises(kiln.InvalidArgumentError, match="another model"):
        kq.quantize(other, calib)
    with pytest.raises(kiln.InvalidArgumentError, match="not in the model"):
        kq.quantize(model, calib, exclude=["no_such_node"])
    for budget, why in [("cosine", "METRIC:VALUE"), ("cosine:1.5", r"\[0, 1\]"), ("psnr:30", "METRIC:VALUE"),
                        ("top1:x", "not a number")]:
        with pytest.raises(kiln.InvalidArgumentError, match=why):
            kq.parse_budget(budget)
    path = tmp_path / "c.json"
    calib.save(path)
    assert kq.Calibration.load(path).amax == pytest.approx(calib.amax)
    path.write_text(path.read_text().replace('"amax": ', '"amax": -', 1))
    with pytest.raises(kiln.InvalidArgumentError, match="non-negative amax"):
        kq.Calibration.load(path)
    path.write_text("{}")
    with pytest.raises(kiln.InvalidArgumentError, match="not a kiln calibration cache"):
        kq.Calibration.load(path)


def test_quantize_command(model, data, tmp_path):
    x, _ = data
    np.savez(tmp_path / "calib.npz", image=x[CALIB])
    np.savez(tmp_path / "holdout.npz", image=x[HOLDOUT][:128])
    cache, out = tmp_path / "calib.json", tmp_path / "q.onnx"
    cmd = [sys.executable, "-m", "kiln.quantize", f"--onnx={model}", f"--calib={tmp_path / 'calib.npz'}",
           "--calibMethod=percentile", f"--calibCache={cache}", f"--output={out}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "calibrated" in r.stdout and "calibration cache written" in r.stdout and out.is_file()
    assert json.loads(cache.read_text())["method"] == "percentile"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # the cache is read, not remade
    assert r.returncode == 0 and "calibration read from" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(cmd[:-1] + [f"--output={tmp_path / 'b.onnx'}", "--accuracyBudget=top1:0.99",
                                   f"--holdout={tmp_path / 'holdout.npz'}"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "budget 0.99" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(cmd[:4] + ["--calibMethod=kl", f"--output={out}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "invalid choice: 'kl'" in r.stderr
    np.savez(tmp_path / "bad.npz", image=x[:0])
    r = subprocess.run(cmd[:4] + [f"--calib={tmp_path / 'bad.npz'}", f"--output={tmp_path / 'c.onnx'}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "same number (> 0) of samples" in r.stderr, r.stderr


def kiln_command():
    """The `kiln` CLI beside this interpreter (pip install . puts it there), else on PATH; skips without one."""
    beside = pathlib.Path(sys.executable).with_name("kiln")
    command = str(beside) if beside.exists() else shutil.which("kiln")
    if not command:
        pytest.skip("no `kiln` command beside this interpreter or on PATH (pip install . makes one)")
    return command


def test_kiln_command_runs_quantize():
    command = kiln_command()
    r = subprocess.run([command, "quantize", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage: kiln quantize" in r.stdout, r.stderr
    r = subprocess.run([command, "--help"], capture_output=True, text=True, timeout=60)
    assert "quantize" in r.stdout


def test_kiln_build_int8_calib(model, data, fp32, tmp_path):
    """kiln build --int8 --calib: calibrated, built with the Q/DQ nodes, its top-1 that of FP32; the
    cache it writes is read back by a second build through trtexec's --calib=<cache> habit."""
    command = kiln_command()
    x, _ = data
    np.savez(tmp_path / "calib.npz", image=x[CALIB])
    cache, engine_path = tmp_path / "calib.json", tmp_path / "int8.kiln"
    base = [command, "build", f"--onnx={model}", "--int8", "--minShapes=image:1x1x8x8",
            "--optShapes=image:64x1x8x8", "--maxShapes=image:64x1x8x8"]
    r = subprocess.run(base + [f"--calib={tmp_path / 'calib.npz'}", "--calibMethod=minmax",
                               f"--calibCache={cache}", f"--saveEngine={engine_path}"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "calibrating" in r.stdout and "calibration cache written" in r.stdout, r.stdout
    assert json.loads(cache.read_text())["method"] == "minmax"
    got = logits(kiln.Engine.load(engine_path), x[HOLDOUT])
    agree = float(np.mean(got.argmax(1) == fp32.argmax(1)))
    print(f"kiln build --int8 --calib: top-1 agreement with FP32 {agree:.4f}")
    assert agree >= 0.99
    r = subprocess.run(base + [f"--calib={cache}", f"--saveEngine={tmp_path / 'again.kiln'}"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "calibration read from" in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "again.kiln").read_bytes() == engine_path.read_bytes()
    r = subprocess.run(base + [f"--calib={tmp_path / 'missing.npz'}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "neither a folder of .npz files nor an .npz file" in r.stderr, r.stdout + r.stderr
    assert "calibrating" in r.stdout and "its error is above" in r.stderr


def test_kiln_compare_int8_calib(model, data, fp32, tmp_path):
    """kiln compare --int8 --calib: the INT8 engine kiln calibrates and builds, against ONNX Runtime
    running the FP32 model on the held-out digits; its cosine and top-1 are those the test computes
    itself from the same calibration, and the flags that would calibrate nothing are refused."""
    command = kiln_command()
    x, _ = data
    np.savez(tmp_path / "calib.npz", image=x[CALIB])
    np.save(tmp_path / "holdout.npy", x[HOLDOUT])
    cache, n = tmp_path / "calib.json", len(x[HOLDOUT])
    # compare judges elementwise only: neither the float32 defaults it picks for this engine nor its
    # int8 ones (0.1 + 0.1*|ref|) hold a healthy INT8 engine's error on logits near zero. 5% of the
    # logits' range holds minmax INT8's (max |diff| 0.42 on both networks, ranges 32 and 21).
    atol = 0.05 * float(np.abs(fp32).max())
    base = [command, "compare", f"--onnx={model}", "--int8", f"--shapes=image:{n}x1x8x8"]
    r = subprocess.run(base + [f"--calib={tmp_path / 'calib.npz'}", "--calibMethod=minmax", f"--calibCache={cache}",
                               f"--loadInputs=image:{tmp_path / 'holdout.npy'}", f"--atol={atol:.3g}", "--rtol=0"],
                       capture_output=True, text=True, timeout=600)
    out = r.stdout
    print(out)
    assert r.returncode == 0, out + r.stderr
    assert f"calibrating {model} for INT8" in out
    assert re.search(r"^kiln quantize: calibrated \d+ activations on 25 feeds \(minmax\)$", out, re.M), out
    # The engine ran the Q/DQ model; the reference, the FP32 file in ONNX Runtime.
    assert int(re.search(r"^kiln: cpu engine, .*?(\d+) layers in int8", out, re.M).group(1)) >= 1, out
    assert "the int8 layers are the Q/DQ model's QuantizeLinear nodes" in out, out
    assert "--int8 recorded in the engine" not in out, out  # it said both before the 20th session
    assert re.search(rf"^model: {re.escape(str(model))}$", out, re.M), out
    assert re.search(r"^reference: ONNX Runtime \S+, CPUExecutionProvider, FP32 ", out, re.M), out
    assert re.search(rf"^  image: {n}x1x8x8 float32, from ", out, re.M), out
    tol = re.search(r"^tolerance: \|kiln - ref\| <= atol \+ rtol\*\|ref\|, atol (\S+), rtol (\S+) \(given\)$",
                    out, re.M)
    assert tol and float(tol[1]) == pytest.approx(atol, rel=1e-2) and float(tol[2]) == 0, out
    row = re.search(r"^logits +(\d+)x10 +(\S+) +\S+ +(\S+) +\S+ +(\S+) +(\d+)/(\d+) +\d+% +(\d+) +(PASS|FAIL)$",
                    out, re.M)
    assert row, out
    rows, max_abs, mean_abs, cosine = int(row[1]), float(row[2]), float(row[3]), float(row[4])
    agree, violations, verdict = int(row[5]), int(row[7]), row[8]
    assert rows == int(row[6]) == n and violations == 0 and verdict == "PASS", out
    assert out.rstrip().endswith("PASS: 1 of 1 outputs within tolerance"), out
    assert cosine >= 0.999 and agree / n >= 0.99 and max_abs <= atol, out
    # An FP32 engine is within 1e-5 of ONNX Runtime here: an error this size is INT8's.
    assert mean_abs > 1e-3, out
    # The same numbers from the calibration compare wrote, quantized and run in this process.
    assert json.loads(cache.read_text())["method"] == "minmax"
    int8 = logits(engine_of(kq.quantize(model, kq.Calibration.load(cache)).SerializeToString()), x[HOLDOUT])
    ref = ort_logits(model_bytes(model), x[HOLDOUT], optimize=True)
    ours = float(np.sum(int8 * ref) / np.sqrt(np.sum(int8 * int8) * np.sum(ref * ref)))
    assert agree == int(np.sum(int8.argmax(1) == ref.argmax(1))), (agree, out)
    assert cosine == pytest.approx(ours, abs=2e-6), (ours, out)
    assert max_abs == pytest.approx(float(np.abs(int8 - ref).max()), rel=1e-2), out
    print(f"kiln compare --int8 --calib: cosine {cosine:.6f}, top-1 {agree}/{n}, max |diff| {max_abs:.3g} "
          f"(atol {atol:.3g})")
    # Judged by cosine and top-1 alone (no --atol/--rtol): the elementwise tolerance is reported,
    # not required; a cosine above what INT8 reaches fails, naming the criterion.
    held = f"--loadInputs=image:{tmp_path / 'holdout.npy'}"
    r = subprocess.run(base + [f"--calib={cache}", held, "--minCosine=0.999", "--minTop1=0.99"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "; reported, not required: the criteria below judge" in r.stdout, r.stdout
    assert re.search(r"^criteria: cosine >= 0\.999, top-1 >= 0\.99 ", r.stdout, re.M), r.stdout
    assert r.stdout.rstrip().endswith("PASS: 1 of 1 outputs within tolerance"), r.stdout
    r = subprocess.run(base + [f"--calib={cache}", held, "--minCosine=0.9999999"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r"logits: cosine 0\.\d+ is below --minCosine=0\.9999999", r.stdout), r.stdout
    r = subprocess.run(base + [f"--calib={cache}", held, "--minTop1=1.5"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "minTop1" in r.stderr, r.stdout + r.stderr
    # kiln's own CPU reference runs the FP32 model too, not the Q/DQ one the engine came from (the
    # cache given as --calib, trtexec's habit, rebuilds the same engine without calibrating).
    r = subprocess.run(base + [f"--calib={cache}", "--reference=kiln", f"--loadInputs=image:{tmp_path / 'holdout.npy'}",
                               f"--atol={atol:.3g}", "--rtol=0"], capture_output=True, text=True, timeout=600)
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert re.search(r"^reference: kiln CPU reference kernels", out, re.M), out
    row = re.search(r"^logits +\d+x10 +\S+ +\S+ +(\S+) +\S+ +(\S+) +(\d+)/\d+ ", out, re.M)
    assert row and float(row[1]) > 1e-3, out  # INT8 against itself would give 0
    assert float(row[2]) == pytest.approx(ours, abs=1e-5) and int(row[3]) == agree, (ours, out)
    # Flags that would calibrate nothing are refused before any work, naming the flag that is missing.
    r = subprocess.run(base + ["--calibMethod=minmax"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--calibMethod needs the data to calibrate on: --calib=" in r.stderr, r.stderr
    assert "calibrating" not in r.stdout, r.stdout
    r = subprocess.run(base[:3] + [f"--calib={tmp_path / 'calib.npz'}", base[4]], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--calib calibrates an INT8 build: add --int8" in r.stderr, r.stdout + r.stderr
