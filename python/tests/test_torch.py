# kiln.torch: the seeds' modules compiled from nn.Module with Input(min, opt, max), run on torch
# tensors, saved and loaded. Skipped where PyTorch is not installed (pip install .[torch]).
import contextlib
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install '.[torch]')")
pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript")

import kiln  # noqa: E402
import kiln.torch as kt  # noqa: E402


class SeedLinear(torch.nn.Module):
    """Seed 003: two linear layers whose output has seq_len + 1 rows."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.l1, self.l2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        y = self.l2(torch.relu(self.l1(x)))
        return torch.cat([y, y[:, -1:]], dim=1)


class UNet(torch.nn.Module):
    """Seed 001: Conv, PixelShuffle, F.interpolate and skip concatenations."""

    def __init__(self, c=8):
        super().__init__()
        torch.manual_seed(1)
        conv = torch.nn.Conv2d
        self.e1 = torch.nn.Sequential(conv(3, c, 3, padding=1), torch.nn.ReLU())
        self.e2 = torch.nn.Sequential(conv(c, 2 * c, 3, stride=2, padding=1), torch.nn.ReLU())
        self.e3 = torch.nn.Sequential(conv(2 * c, 4 * c, 3, stride=2, padding=1), torch.nn.ReLU())
        self.u3 = conv(4 * c, 8 * c, 1)
        self.d2 = torch.nn.Sequential(conv(4 * c, 2 * c, 3, padding=1), torch.nn.ReLU())
        self.d1 = torch.nn.Sequential(conv(3 * c, c, 3, padding=1), torch.nn.ReLU())
        self.head = conv(c, 12, 1)
        self.ps = torch.nn.PixelShuffle(2)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(a)
        z = self.e3(b)
        u = self.ps(self.u3(z))
        y = self.d2(torch.cat([u, b], 1))
        y = torch.nn.functional.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False)
        y = self.d1(torch.cat([y, a], 1))
        return self.ps(self.head(y))


def close(got, want, atol=1e-4, rtol=1e-3):
    assert isinstance(got, torch.Tensor)
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=atol, rtol=rtol)


@pytest.fixture(scope="module")
def linear():
    model = SeedLinear().eval()
    compiled = kt.compile(model, inputs=[kt.Input(min_shape=(1, 1, 16), opt_shape=(4, 32, 16), max_shape=(10, 128, 16),
                                                  name="x", dim_names=("batch", "seq_len"))])
    return model, compiled


def test_two_linear_output_is_seq_len_plus_one(linear):
    model, compiled = linear
    # An nn.Module: it composes with others.
    assert isinstance(compiled, torch.nn.Module)
    chained = torch.nn.Sequential(compiled, torch.nn.ReLU())
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        close(chained(x), torch.relu(model(x)))
    (shape,) = compiled.output_shapes().values()
    assert shape == ["batch", "seq_len + 1", "8"]
    with torch.no_grad():
        for dims in [(3, 7), (1, 1), (10, 128), (2, 64)]:
            x = torch.randn(*dims, 16)
            got = compiled(x)
            assert tuple(got.shape) == (dims[0], dims[1] + 1, 8)
            close(got, model(x))
    with pytest.raises(kiln.InvalidArgumentError, match="seq_len"):
        compiled(torch.randn(2, 129, 16))  # outside the profile: the dim and its range are named


def test_unet_dynamic_height_and_width():
    model = UNet().eval()
    # H and W any size: two stride-2 levels concatenated with their upsampling need multiples of 4,
    # and kiln's shape check says so, with the values that fail and a range that would build.
    with pytest.raises(kiln.InvalidArgumentError, match=r"fails in profile 0 \(h in \[200, 400\]\).*first at h=201"):
        kt.compile(model, inputs=[kt.Input(min_shape=(1, 3, 200, 200), max_shape=(2, 3, 400, 400), name="x",
                                           dim_names=("n", None, "h", "w"))])
    compiled = kt.compile(model, inputs=[kt.Input(min_shape=(1, 3, 200, 200), opt_shape=(2, 3, 300, 300),
                                                  max_shape=(2, 3, 400, 400), name="x",
                                                  dim_names=("n", None, "4*h", "4*w"))])
    with torch.no_grad():
        for shape in [(2, 3, 200, 200), (1, 3, 300, 400)]:
            x = torch.randn(*shape)
            got = compiled(x)
            want = model(x)
            assert tuple(got.shape) == tuple(want.shape) == (shape[0], 3, 2 * shape[2], 2 * shape[3])
            close(got, want)


def test_opt_at_the_small_end_still_exports():
    # opt 1 (a latency profile): torch.export's dims start at 2, so the traced example moves inside
    # them while the engine keeps opt 1.
    model = SeedLinear().eval()
    compiled = kt.compile(model, inputs=[kt.Input(min_shape=(1, 1, 16), opt_shape=(1, 1, 16), max_shape=(4, 9, 16),
                                                  name="x", dim_names=("batch", "seq_len"))])
    assert compiled.engine.profile_shape("x", 0, kiln.OptProfileSelector.OPT) == (1, 1, 16)
    with torch.no_grad():
        x = torch.randn(1, 1, 16)
        close(compiled(x), model(x))


def test_save_and_load_run_without_the_module(linear, tmp_path):
    model, compiled = linear
    path = tmp_path / "linear.kiln"
    kt.save(compiled, path)
    again = kt.load(path)
    assert again.input_names == ["x"] and again.output_names == compiled.output_names
    x = torch.randn(5, 9, 16)
    close(again(x), compiled(x), atol=0, rtol=0)
    bad = tmp_path / "bad.kiln"
    bad.write_bytes(b"not a compiled module")
    with pytest.raises(kiln.InvalidArgumentError, match="is not a file kiln.torch.save wrote"):
        kt.load(bad)
    tampered = tmp_path / "tampered.kiln"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # inside the engine: its checksum catches it
    tampered.write_bytes(bytes(data))
    with pytest.raises(kiln.Error):
        kt.load(tampered)
    # The device it loads onto: a CPU engine only on the CPU; a device string is checked by name.
    close(kt.load(path, device="cpu")(x), compiled(x), atol=0, rtol=0)
    with pytest.raises(kiln.InvalidArgumentError, match="built for cpu"):
        kt.load(path, device=torch.device("cuda", 0))
    with pytest.raises(kiln.InvalidArgumentError, match="'tpu:0'"):
        kt.load(path, device="tpu:0")
    with pytest.raises(kiln.InvalidArgumentError, match="'gpu'"):
        kt.compile(model, inputs=[kt.Input(shape=(1, 1, 16), name="x")], device="gpu")


def test_save_and_load_refuse_special_files(linear, tmp_path):
    _, compiled = linear
    # A FIFO named as the target of save or the source of load: refused, never opened (a writer
    # or reader would block until the other end came), and left as it is (issue 41, class 3).
    import os
    import stat

    fifo = tmp_path / "engine.fifo"
    os.mkfifo(fifo)
    with pytest.raises(kiln.InvalidArgumentError, match="not a regular file"):
        kt.save(compiled, fifo)
    with pytest.raises(kiln.InvalidArgumentError, match="not a regular file"):
        kt.load(fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(kiln.InvalidArgumentError, match="not a regular file"):
        kt.save(compiled, tmp_path)  # a directory
    # A symbolic link to a file: the file is replaced, the link stays.
    real = tmp_path / "real.kt"
    real.write_bytes(b"old")
    link = tmp_path / "link.kt"
    link.symlink_to(real)
    kt.save(compiled, link)
    assert link.is_symlink() and kt.load(link).output_names == compiled.output_names
    assert real.read_bytes()[:10] == b"KILNTORCH1"
    # A new file gets a plain open's mode (0666 less the umask), a replaced one keeps its own.
    umask = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.kt"
        kt.save(compiled, fresh)
        assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o644
        os.chmod(real, 0o640)
        kt.save(compiled, link)
        assert stat.S_IMODE(os.stat(real).st_mode) == 0o640
    finally:
        os.umask(umask)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary left behind


def test_bad_arguments_are_named(linear):
    _, compiled = linear
    with pytest.raises(kiln.InvalidArgumentError, match="min <= opt <= max"):
        kt.Input(min_shape=(4, 1), max_shape=(2, 1))
    with pytest.raises(kiln.InvalidArgumentError, match="differ in rank"):
        kt.Input(min_shape=(1, 2), max_shape=(1, 2, 3))
    with pytest.raises(kiln.InvalidArgumentError, match="takes 1 inputs"):
        compiled(torch.zeros(1, 1, 16), torch.zeros(1, 1, 16))
    with pytest.raises(kiln.InvalidArgumentError, match="not a torch tensor"):
        compiled(np.zeros((1, 1, 16), np.float32))
    with pytest.raises(kiln.InvalidArgumentError, match="enabled_precisions"):
        kt.compile(SeedLinear(), inputs=[kt.Input(shape=(1, 2, 16))], enabled_precisions={torch.int8})


class Branchy(torch.nn.Module):
    """A data-dependent Python branch: TorchDynamo breaks the graph at it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.a, self.b, self.c = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.a(x))
        if y.sum() > 0:  # decided by the data
            y = self.b(y)
        return self.c(y)


@pytest.fixture
def kiln_backend():
    """torch.compile's backend name: "kiln" through the package's torch_dynamo_backends entry point."""
    import torch._dynamo

    torch._dynamo.reset()
    kt.report.clear()
    torch._dynamo.lookup_backend("kiln")  # the entry point of the installed package
    yield "kiln"
    torch._dynamo.reset()


def test_torch_compile_backend_resnet18(kiln_backend):
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    compiled = torch.compile(model, backend=kiln_backend)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad(), _no_fallback():
        got = compiled(x)
        want = model(x)
    close(got, want, atol=1e-3, rtol=1e-3)
    assert [g["runner"] for g in kt.report.graphs] == ["kiln"], str(kt.report)


def test_torch_compile_backend_reports_the_graph_break(kiln_backend):
    model = Branchy().eval()
    compiled = torch.compile(model, backend=kiln_backend)
    with torch.no_grad():
        for seed in range(4):  # both sides of the branch
            x = torch.randn(3, 8, generator=torch.Generator().manual_seed(seed)) * (1 if seed % 2 else -1)
            with pytest.warns(kiln.KilnWarning, match="graph break") if seed == 0 else _no_fallback():
                got = compiled(x)
            close(got, model(x), atol=1e-5, rtol=1e-4)
    assert kt.report.graph_breaks >= 1, str(kt.report)
    assert not kt.report.fallbacks, str(kt.report)
    assert "graph breaks" in str(kt.report)


def test_torch_compile_backend_dynamic_ranges(kiln_backend):
    # Seed 003's module through torch.compile with batch and seq_len marked dynamic: one engine
    # spans both ranges (the graph's size arguments are read off the tensor), so new shapes inside
    # them run without a recompilation.
    model = SeedLinear().eval()
    compiled = torch.compile(model, backend=kiln_backend)
    x = torch.randn(2, 5, 16)
    torch._dynamo.mark_dynamic(x, 0, min=1, max=8)
    torch._dynamo.mark_dynamic(x, 1, min=2, max=64)
    with torch.no_grad(), _no_fallback():
        close(compiled(x), model(x))
        # (TorchDynamo specializes sizes 0 and 1, so a batch of 1 would be a new graph.)
        for dims in [(3, 7), (8, 64), (2, 2)]:
            y = torch.randn(*dims, 16)
            got = compiled(y)
            assert tuple(got.shape) == (dims[0], dims[1] + 1, 8)
            close(got, model(y))
    assert [g["runner"] for g in kt.report.graphs] == ["kiln"], str(kt.report)
    # A dim TorchDynamo made dynamic on its own (a recompilation after the batch changed) has no
    # upper bound: the graph stays with PyTorch and the reason names the way to give one.
    kt.report.clear()
    torch._dynamo.reset()
    again = torch.compile(SeedLinear().eval(), backend=kiln_backend)
    with torch.no_grad():
        again(torch.randn(2, 3, 16))
        with pytest.warns(kiln.KilnWarning, match="no upper bound.*mark_dynamic"):
            again(torch.randn(4, 3, 16))
    # With options={"dynamic_max": N} it builds, up to N.
    torch._dynamo.reset()
    bounded = torch.compile(SeedLinear().eval(), backend="kiln", options={"dynamic_max": 16})
    with torch.no_grad(), _no_fallback():
        bounded(torch.randn(2, 3, 16))
        out = bounded(torch.randn(9, 3, 16))
    assert tuple(out.shape) == (9, 4, 8)


def test_fallback_false_makes_a_graph_kiln_cannot_take_an_error(kiln_backend):
    # The recompiled graph above, whose batch has no upper bound: with options={"fallback": False}
    # it is an error naming the reason, not a warning and a silent PyTorch run.
    strict = torch.compile(SeedLinear().eval(), backend=kiln_backend, options={"fallback": False})
    with torch.no_grad():
        strict(torch.randn(2, 3, 16))
        with pytest.raises(Exception, match="fallback=False.*no upper bound"):
            strict(torch.randn(4, 3, 16))
    assert not kt.report.fallbacks, str(kt.report)


_REGISTRATION = r"""
import importlib.metadata as md
import sys
order = sys.argv[1]
if order == "no-entry-point":
    # As a source checkout or a copied folder has it: no torch_dynamo_backends entry point "kiln".
    real = md.entry_points
    def entry_points(*args, **kwargs):
        eps = real(*args, **kwargs)
        if kwargs.get("group") == "torch_dynamo_backends":
            return md.EntryPoints([e for e in eps if e.name != "kiln"])
        return eps
    md.entry_points = entry_points
import torch._dynamo
from torch._dynamo.backends.registry import lookup_backend
if order == "no-entry-point":
    assert "kiln" not in torch._dynamo.list_backends(exclude_tags=()), "kiln listed before the import"
    import kiln.torch
    assert "kiln" in torch._dynamo.list_backends(exclude_tags=()), torch._dynamo.list_backends(exclude_tags=())
elif order == "lookup-first":
    fn = lookup_backend("kiln")  # the entry point, loaded
    import kiln.torch  # registers nothing twice
else:
    import kiln.torch
    fn = lookup_backend("kiln")
fn = lookup_backend("kiln")
assert callable(fn)
print("ok", order)
"""


@pytest.mark.parametrize("order", ["no-entry-point", "lookup-first", "import-first"])
def test_import_kiln_torch_registers_the_backend(order):
    # Without the package's entry point (a plain source path), `import kiln.torch` alone makes
    # "kiln" a torch.compile backend; with it, either order of lookup and import works.
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _REGISTRATION, order], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and f"ok {order}" in r.stdout, r.stdout + r.stderr


def test_examples_follow_the_module_dtype_and_device():
    # A module held in bfloat16 traces with bfloat16 examples where the Input names no dtype; an
    # Input's own dtype wins; the examples are made on the module's device (the CPU here; the CUDA
    # case is python/tests/test_torch_cuda.py's on the GPU host).
    model = SeedLinear().to(torch.bfloat16)
    device, dtype = kt._held(model)
    assert device.type == "cpu" and dtype == torch.bfloat16
    x = kt._example(kt.Input(shape=(2, 5, 16)), (2, 5, 16), device, dtype)
    assert x.dtype == torch.bfloat16 and x.device.type == "cpu"
    ids = kt._example(kt.Input(shape=(2, 5), dtype=torch.int64), (2, 5), device, dtype)
    assert ids.dtype == torch.int64
    assert kt._held(torch.nn.ReLU()) == (torch.device("cpu"), None)
    # A TorchDynamo graph whose parameters are arguments: the backend marks its inputs' device.
    relu = torch.nn.ReLU()
    relu._kiln_example_device = torch.device("cuda", 1)
    assert kt._held(relu)[0] == torch.device("cuda", 1)
    # The same seeded values whatever the dtype (up to its rounding).
    x32 = kt._example(kt.Input(shape=(2, 5, 16)), (2, 5, 16))
    assert x32.dtype == torch.float32
    assert torch.allclose(x.float(), x32, rtol=1e-2, atol=1e-2)


class ConvStack(torch.nn.Module):
    """Eight 3x3 convs, a 1x1 and a depthwise one (whose weights are contiguous in both formats, as
    ResNet's and MobileNet's are) and a head: enough convolutions that kiln's CPU runs them
    channels-last."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        layers, c = [], 3
        for o in (16, 16, 24, 24, 32, 32, 48, 48):
            layers += [torch.nn.Conv2d(c, o, 3, padding=1), torch.nn.ReLU()]
            c = o
        layers += [torch.nn.Conv2d(c, c, 1), torch.nn.ReLU(), torch.nn.Conv2d(c, c, 3, padding=1, groups=c)]
        self.features = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(48, 10)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


def test_a_channels_last_module_takes_its_images_channels_last(tmp_path):
    # Held channels-last (as GPU users hold CNNs), the module's 4-D input becomes the engine's
    # [N, H, W, C] input: a channels-last tensor goes in as it lies, and the Transpose in front of
    # the channels-last convolutions cancels against the module's own; an NCHW tensor still runs.
    model = ConvStack().eval().to(memory_format=torch.channels_last)
    spec = dict(min_shape=(1, 3, 16, 16), opt_shape=(2, 3, 16, 16), max_shape=(4, 3, 16, 16), name="x")
    compiled = kt.compile(model, inputs=[kt.Input(**spec)])
    assert compiled.channels_last_inputs == ["x"]
    assert tuple(compiled.engine.get_tensor_shape("x")) == (-1, 16, 16, 3)
    x = torch.randn(3, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        want = model(x)
    close(compiled(x), want, atol=1e-5, rtol=1e-4)
    close(compiled(x.contiguous()), want, atol=1e-5, rtol=1e-4)
    path = tmp_path / "cl.kiln"
    kt.save(compiled, path)
    again = kt.load(path)
    assert again.channels_last_inputs == ["x"]
    close(again(x), compiled(x), atol=0, rtol=0)
    # format= decides over the module's own: NCHW asked for, NCHW built.
    nchw = kt.compile(model, inputs=[kt.Input(**spec, format=torch.contiguous_format)])
    assert nchw.channels_last_inputs == [] and tuple(nchw.engine.get_tensor_shape("x")) == (-1, 3, 16, 16)
    close(nchw(x), want, atol=1e-5, rtol=1e-4)
    # A module held NCHW keeps an NCHW input unless the Input asks for channels-last.
    plain = ConvStack().eval()
    assert kt.compile(plain, inputs=[kt.Input(**spec)]).channels_last_inputs == []
    asked = kt.compile(plain, inputs=[kt.Input(**spec, format=torch.channels_last)])
    assert asked.channels_last_inputs == ["x"]
    with torch.no_grad():
        close(asked(x.contiguous()), plain(x), atol=1e-5, rtol=1e-4)
    with pytest.raises(kiln.InvalidArgumentError, match="must be 4-D"):
        asked(torch.randn(3, 16, 16))
    with pytest.raises(kiln.InvalidArgumentError, match="format must be"):
        kt.Input(**spec, format=torch.preserve_format)
    with pytest.raises(kiln.InvalidArgumentError, match="takes a 4-D"):
        kt.Input(shape=(2, 16), format=torch.channels_last)


def test_a_bfloat16_conv_bn_module_builds_and_runs_on_the_cpu():
    # onnxscript's optimizer folds a bfloat16 BatchNorm into float32 convolution weights, an ONNX
    # model whose Conv mixes bfloat16 and float32: kiln.torch exports bfloat16 modules unoptimized.
    # Outputs of a bfloat16 engine come back as bfloat16 torch tensors.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3, padding=1), torch.nn.BatchNorm2d(4)).eval()
    with torch.no_grad():
        for bn in (model[1], model[4]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    model = model.to(torch.bfloat16)
    compiled = kt.compile(model, inputs=[kt.Input(min_shape=(1, 3, 8, 8), opt_shape=(2, 3, 8, 8),
                                                  max_shape=(4, 3, 8, 8), name="x")],
                          enabled_precisions={torch.bfloat16})
    x = torch.randn(3, 3, 8, 8).to(torch.bfloat16)
    with torch.no_grad():
        got, want = compiled(x), model(x)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    cosine = torch.nn.functional.cosine_similarity(got.double().flatten(), want.double().flatten(), dim=0).item()
    assert cosine >= 0.999, cosine


@contextlib.contextmanager
def _no_fallback():
    """No KilnWarning about a graph falling back to PyTorch inside the block."""
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        yield
    fell = [str(w.message) for w in log if "runs on PyTorch" in str(w.message)]
    assert not fell, fell


class WithTrainingDropout(torch.nn.Module):
    """Something kiln does not take: dropout that draws random numbers (training mode)."""

    def forward(self, x):
        return torch.nn.functional.dropout(x, p=0.5, training=True)


def test_build_errors_name_the_module_source_line():
    with pytest.raises(kiln.Error) as e:
        kt.compile(WithTrainingDropout(), inputs=[kt.Input(shape=(1, 2, 8, 8), name="x")])
    message = str(e.value)
    # kiln's own error names the node; the exporter's stack trace adds the module's line.
    assert "training-mode Dropout" in message, message
    assert "test_torch.py" in message and "training=True" in message, message


class WithNonZero(torch.nn.Module):
    """A data-dependent output size: one row per positive element."""

    def forward(self, x):
        return torch.nonzero(x > 0) * 2


def test_data_dependent_output_has_its_exact_size():
    compiled = kt.compile(WithNonZero(), inputs=[kt.Input(min_shape=(1, 3), opt_shape=(2, 3), max_shape=(8, 3), name="x")])
    for x in (torch.tensor([[1.0, -1.0, 2.0], [0.0, 3.0, -2.0]]), torch.zeros(4, 3), torch.ones(8, 3)):
        want = torch.nonzero(x > 0) * 2
        got = compiled(x)
        assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
        assert torch.equal(got, want)


def test_cuda_graph_staging_logic_with_a_stand_in_context(monkeypatch):
    # kiln.torch's CUDA-graph path (CompiledModule._run_staged) on the CPU, with a stand-in for the
    # engine's context and torch's stream and event (the GPU case is test_torch_cuda.py's): buffers
    # sized once for the profile's max shapes, so their addresses (and the captured graphs) stay;
    # a call of the last call's shapes binds nothing again; every call's outputs are its own.
    class Stream:
        cuda_stream = 0

        def wait_event(self, event):
            pass

    class Event:
        def record(self, stream):
            pass

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    class Context:
        def __init__(self):
            self.shapes, self.addresses, self.calls, self.use_cuda_graph = {}, {}, [], False

        def set_input_shape(self, name, shape):
            self.shapes[name] = tuple(shape)
            self.calls.append("shape")

        def tensor_shape(self, name):
            return (self.shapes["x"][0], 4) if name == "y" else self.shapes[name]

        def set_tensor_address(self, name, address):
            self.addresses[name] = address
            self.calls.append("address")

        def execute_async_v3(self, stream):  # y = 2 * x[:, :4], from the bound buffers
            x = compiled._stage["x"][:int(np.prod(self.shapes["x"]))].view(self.shapes["x"])
            assert self.addresses["x"] == compiled._stage["x"].data_ptr()
            compiled._stage["y"][:x.shape[0] * 4].view(x.shape[0], 4).copy_(2 * x[:, :4])
            self.calls.append("run")

    class Engine:
        def create_execution_context(self):
            return Context()

        def tensor_dtype(self, name):
            return np.float32

        def get_tensor_profile_shape(self, name, profile):
            return (1, 8), (4, 8), (10, 8)

    compiled = kt.CompiledModule(Engine(), ["x"], ["y"], "cuda")
    cpu = torch.device("cpu")
    outs = []
    for batch in (3, 5, 3, 3):
        x = torch.randn(batch, 8)
        (y,) = compiled._run_staged({"x": x}, cpu, cpu)
        torch.testing.assert_close(y, 2 * x[:, :4])
        outs.append((y, 2 * x[:, :4]))
        # Sized for the max at the first call: 10 x 8 inputs, 10 x 4 outputs.
        assert compiled._stage["x"].numel() == 80 and compiled._stage["y"].numel() == 40
    assert compiled._context.calls[-2:] == ["run", "run"], "the fourth call (the third's shapes) bound again"
    for y, want in outs:  # no call's output was overwritten by a later one
        torch.testing.assert_close(y, want)
