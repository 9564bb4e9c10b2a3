"""kiln.torch: from an nn.Module to a kiln engine, and torch tensors in and out.

    import kiln.torch, torch
    compiled = kiln.torch.compile(model, inputs=[kiln.torch.Input(
        min_shape=(1, 1, 16), opt_shape=(4, 32, 16), max_shape=(10, 128, 16), name="x",
        dim_names=("batch", "seq_len", None))])
    y = compiled(torch.randn(3, 7, 16))          # a torch tensor of exactly the shape PyTorch gives
    compiled.output_shapes()                     # {"out0": ["batch", "seq_len + 1", "8"]}
    kiln.torch.save(compiled, "model.kiln")      # the engine and its IO names; no Python class
    again = kiln.torch.load("model.kiln")

Under it: torch.export through torch.onnx.export(dynamo=True) with one torch.export.Dim per
dynamic axis (an axis whose min and max differ), named by `dim_names` (default NAME_dAXIS) with
the Input's range; dims that depend on others (seq_len + 1, 2*h, the floor divisions of strided
convolutions) come out of the exporter as formulas over those names, which kiln's builder reads as
its symbolic dims, so the engine's profile is exactly the Inputs' min/opt/max. The engine runs on
the CPU or, where kiln was built with CUDA, on the GPU (`device="cuda"`); torch tensors go in
through DLPack and the outputs come back as torch tensors.

`import kiln` never needs torch; `import kiln.torch` does (`pip install .[torch]` brings it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _kiln
from . import onnx as _onnx
from ._errors import Error, InvalidArgumentError
from ._files import open_regular, write_regular
from .session import KilnWarning

__all__ = ["Input", "CompiledModule", "compile", "save", "load", "backend", "CompileReport", "report"]

Shape = Tuple[int, ...]


try:
    import torch
except ImportError as _e:  # pragma: no cover - exercised only without torch
    raise ImportError("kiln.torch needs PyTorch: pip install 'kiln[torch]'") from _e


class Input:
    """One input of the module: its shape range (Torch-TensorRT's spelling), dtype and name.

    `shape=` alone is a static shape. `dim_names` names the dynamic axes (None or missing: NAME_dAXIS);
    two inputs that share a dim (a batch) give it the same name. "K*name" says the axis takes only
    multiples of K (name then ranges over the multiples inside the axis's range), as a model whose
    strided levels must divide the size evenly needs. `format` (Torch-TensorRT's): the memory
    format of the tensors the module will be called with. torch.channels_last builds the engine's
    input channels-last ([N, H, W, C], TensorRT's HWC format), so a channels-last tensor goes in
    without a transpose; None (the default) picks it for a 4-D floating-point input of a module
    whose 4-D weights are channels-last (`model.to(memory_format=torch.channels_last)`). Shapes
    stay in the module's (N, C, H, W) order either way, and a tensor of the other format still runs
    (copied into the engine's).
    """

    def __init__(self, min_shape: Optional[Sequence[int]] = None, opt_shape: Optional[Sequence[int]] = None,
                 max_shape: Optional[Sequence[int]] = None, *, shape: Optional[Sequence[int]] = None,
                 dtype: Any = None, name: Optional[str] = None, dim_names: Optional[Sequence[Optional[str]]] = None,
                 format: Any = None):  # noqa: A002 - Torch-TensorRT's keyword
        if shape is not None:
            if min_shape is not None or opt_shape is not None or max_shape is not None:
                raise InvalidArgumentError("kiln.torch.Input: give shape= or min_shape/opt_shape/max_shape, not both")
            min_shape = opt_shape = max_shape = shape
        if min_shape is None or max_shape is None:
            raise InvalidArgumentError("kiln.torch.Input: min_shape and max_shape (or shape) are required")
        self.min_shape: Shape = tuple(int(d) for d in min_shape)
        self.max_shape: Shape = tuple(int(d) for d in max_shape)
        self.opt_shape: Shape = tuple(int(d) for d in (opt_shape if opt_shape is not None else max_shape))
        if not (len(self.min_shape) == len(self.opt_shape) == len(self.max_shape)):
            raise InvalidArgumentError(f"kiln.torch.Input {name or ''}: min, opt and max shapes differ in rank: "
                                       f"{self.min_shape}, {self.opt_shape}, {self.max_shape}")
        for axis, (lo, opt, hi) in enumerate(zip(self.min_shape, self.opt_shape, self.max_shape)):
            if not 0 <= lo <= opt <= hi:
                raise InvalidArgumentError(f"kiln.torch.Input {name or ''}: axis {axis} needs 0 <= min <= opt <= max, "
                                           f"got {lo}, {opt}, {hi}")
        self.dtype = dtype
        self.name = name
        names = list(dim_names) if dim_names is not None else []
        if len(names) > len(self.min_shape):
            raise InvalidArgumentError(f"kiln.torch.Input {name or ''}: {len(names)} dim_names for rank "
                                       f"{len(self.min_shape)}")
        self.dim_names: List[Optional[str]] = names + [None] * (len(self.min_shape) - len(names))
        if format not in (None, torch.contiguous_format, torch.channels_last):
            raise InvalidArgumentError(f"kiln.torch.Input {name or ''}: format must be torch.contiguous_format or "
                                       f"torch.channels_last, got {format!r}")
        if format == torch.channels_last and len(self.min_shape) != 4:
            raise InvalidArgumentError(f"kiln.torch.Input {name or ''}: format=torch.channels_last takes a 4-D "
                                       f"input (N, C, H, W), this one has rank {len(self.min_shape)}")
        self.format = format

    def dynamic_axes(self) -> List[int]:
        return [a for a, (lo, hi) in enumerate(zip(self.min_shape, self.max_shape)) if lo != hi]

    def __repr__(self) -> str:
        return (f"Input(name={self.name!r}, min_shape={self.min_shape}, opt_shape={self.opt_shape}, "
                f"max_shape={self.max_shape}, dtype={self.dtype})")


def _held(module: Any) -> Tuple[Any, Any]:
    """Where the user holds the module: the device of its first parameter or buffer (the CPU for
    one with neither), and the dtype of its first floating-point one (None for none)."""
    device, dtype = torch.device("cpu"), None
    tensors = []
    if hasattr(module, "parameters"):
        tensors = [*module.parameters(), *module.buffers()]
    if tensors:
        device = tensors[0].device
    # A TorchDynamo graph whose parameters arrive as arguments: the device of its example tensors.
    device = getattr(module, "_kiln_example_device", None) or device
    dtype = next((t.dtype for t in tensors if t.dtype.is_floating_point), None)
    return device, dtype


def _example(inp: Input, shape: Sequence[int], device: Any = None, float_dtype: Any = None) -> Any:
    """The traced example for an Input: seeded, made on the CPU (the same values on any device)
    and moved once to the module's device; a floating-point Input without a dtype takes the
    module's (a .half() module traces with half inputs, as it runs)."""
    dtype = inp.dtype if inp.dtype is not None else (float_dtype or torch.float32)
    g = torch.Generator().manual_seed(0)
    if dtype.is_floating_point:
        x = torch.randn(tuple(shape), generator=g, dtype=torch.float32).to(dtype)
    elif dtype == torch.bool:
        x = torch.ones(tuple(shape), dtype=torch.bool)
    else:
        x = torch.randint(0, 2, tuple(shape), generator=g, dtype=dtype)
    return x if device is None or torch.device(device).type == "cpu" else x.to(device)


def _channels_last_module(module: Any) -> bool:
    """Whether the module holds its 4-D weights channels-last (and so, as its user, its images).
    Only weights whose layout tells are asked: a 1x1 kernel (ResNet's bottlenecks) or a single
    input channel (depthwise) is contiguous in both formats."""
    params = list(module.parameters()) if hasattr(module, "parameters") else []
    four = [p for p in params if p.dim() == 4 and p.shape[1] > 1 and p.shape[2] * p.shape[3] > 1]
    return bool(four) and all(p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
                              for p in four)


def _takes_channels_last(inp: Input, module_channels_last: bool) -> bool:
    if inp.format is not None:
        return inp.format == torch.channels_last
    floating = inp.dtype is None or inp.dtype.is_floating_point
    return module_channels_last and floating and len(inp.min_shape) == 4


def _nhwc(inp: Input) -> Input:
    """The Input of the engine's channels-last tensor: its shapes and dim names as (N, H, W, C)."""
    perm = (0, 2, 3, 1)
    return Input([inp.min_shape[a] for a in perm], [inp.opt_shape[a] for a in perm],
                 [inp.max_shape[a] for a in perm], dtype=inp.dtype, name=inp.name,
                 dim_names=[inp.dim_names[a] for a in perm])


class _ChannelsLastInputs(torch.nn.Module):
    """The module behind inputs taken channels-last: each flagged (N, H, W, C) input is permuted back
    to the (N, C, H, W) the module expects, a Transpose the builder cancels against the one its NHWC
    convolutions would put there."""

    def __init__(self, module: Any, flags: Sequence[bool]):
        super().__init__()
        self.module = module
        self.flags = list(flags)

    def forward(self, *tensors: Any) -> Any:
        return self.module(*[x.permute(0, 3, 1, 2) if f else x for x, f in zip(tensors, self.flags)])


def _export(module: Any, inputs: List[Input], names: List[str]) -> bytes:
    """The module as ONNX bytes, its dynamic axes named and ranged from the Inputs."""
    from torch.export import Dim  # noqa: PLC0415

    dims: Dict[str, Any] = {}
    dynamic_shapes = []
    examples = []
    for inp, name in zip(inputs, names):
        spec = {}
        shape = list(inp.opt_shape)
        for axis in inp.dynamic_axes():
            dim_name = inp.dim_names[axis] or f"{name}_d{axis}"
            lo, hi = inp.min_shape[axis], inp.max_shape[axis]
            # "4*h": the axis is a multiple of 4 (a UNet's height through two stride-2 levels);
            # h ranges over the multiples inside [lo, hi].
            m = re.fullmatch(r"\s*(\d+)\s*\*\s*([A-Za-z_]\w*)\s*", dim_name)
            k, base = (int(m.group(1)), m.group(2)) if m else (1, dim_name)
            if k < 1 or not re.fullmatch(r"[A-Za-z_]\w*", base):
                raise InvalidArgumentError(f"kiln.torch.compile: dim name '{dim_name}' of input '{name}' axis "
                                           f"{axis} is neither a name nor K*name")
            blo, bhi = -(-lo // k), hi // k
            if blo > bhi:
                raise InvalidArgumentError(f"kiln.torch.compile: input '{name}' axis {axis}: no multiple of {k} "
                                           f"in [{lo}, {hi}]")
            if base in dims and (dims[base].min, dims[base].max) != (max(blo, 2), max(bhi, 3)):
                raise InvalidArgumentError(f"kiln.torch.compile: dim '{base}' has two ranges: "
                                           f"{dims[base].min}..{dims[base].max} and {blo}..{bhi}")
            # torch.export takes a range of at least 2 values with min >= 0; a dim allowed to be 0
            # or 1 specializes there, so it starts at 2 and kiln's profile keeps the real range.
            dims.setdefault(base, Dim(base, min=max(blo, 2), max=max(bhi, 3)))
            spec[axis] = k * dims[base] if k != 1 else dims[base]
            # The traced example: opt, moved inside what the Dim allows (a multiple of k, at least 2k).
            shape[axis] = k * min(max(inp.opt_shape[axis] // k, dims[base].min), dims[base].max)
        dynamic_shapes.append(spec or None)
        examples.append(shape)
    # The examples on the module's device and in its dtype: the exporter traces the module as the
    # user holds it (a CUDA module with CPU examples failed: "Tensor on device cuda:0 is not on
    # the expected device cpu").
    device, float_dtype = _held(module)
    args = tuple(_example(inp, shape, device, float_dtype) for inp, shape in zip(inputs, examples))
    try:
        # All static (the torch.compile backend's graphs): no dynamic_shapes, which torch.export
        # would match against a GraphModule's *args signature as one element.
        shapes = tuple(dynamic_shapes) if any(d is not None for d in dynamic_shapes) else None
        if shapes is not None and isinstance(module, (_TensorArgs, _ChannelsLastInputs)):
            shapes = {"tensors": shapes}  # its forward(*tensors): one parameter holding them all
        # onnxscript's optimizer (0.7) folds bfloat16 weights into float32 initializers (a bfloat16
        # ResNet-50's convolutions came out with float32 weights and bfloat16 activations, which no
        # ONNX runtime takes): a bfloat16 module is exported unoptimized; kiln folds it itself.
        program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=shapes, input_names=names,
                                    optimize=float_dtype != torch.bfloat16, verbose=False)
    except Exception as e:  # the exporter's own message names the module's source line
        raise InvalidArgumentError(f"kiln.torch.compile: torch.onnx.export failed: {type(e).__name__}: {e}") from e
    return program.model_proto.SerializeToString()


@contextlib.contextmanager
def _source_lines(onnx_bytes: bytes) -> Iterator[None]:
    """Adds to a kiln error the module's source lines of the nodes it names: the exporter records
    each node's Python stack (pkg.torch.onnx.stack_trace), and its first frame is the module's line."""
    try:
        yield
    except Error as e:
        named = list(dict.fromkeys(re.findall(r"node '([^']+)'", str(e))))[:4]
        if not named:
            raise
        try:
            import onnx  # noqa: PLC0415
            model = onnx.load_from_string(onnx_bytes)
        except Exception:  # noqa: BLE001 - the kiln error stands on its own
            raise e from None
        traces = {}
        for node in model.graph.node:
            if node.name in named:
                for prop in node.metadata_props:
                    if prop.key == "pkg.torch.onnx.stack_trace" and prop.value:
                        traces[node.name] = prop.value
        lines = []
        for name in named:
            if name in traces:
                frame = traces[name].strip().splitlines()[:2]  # File "...", line N, in f / the code
                lines.append(f"node '{name}' comes from {frame[0].strip()}" +
                             (f": {frame[1].strip()}" if len(frame) > 1 else ""))
        if not lines:
            raise
        raise type(e)(str(e) + "\n" + "\n".join(lines)) from None


def _profile(inputs: List[Input], names: List[str]) -> Any:
    profile = _kiln.OptimizationProfile()
    for inp, name in zip(inputs, names):
        profile.set_dimensions(name, inp.min_shape, inp.opt_shape, inp.max_shape)
    return profile


_PRECISIONS = {"float16": _kiln.BuilderFlag.FP16, "bfloat16": _kiln.BuilderFlag.BF16}


class CompiledModule(torch.nn.Module):
    """A kiln engine behind torch tensors: an nn.Module to call as the one it was made from.

    Inputs are taken positionally (or by name) as torch tensors, cast to the engine's dtype where
    they differ; outputs are torch tensors of exactly the shapes this call implies, one tensor when
    the engine has one output, else a tuple in the engine's order.
    """

    def __init__(self, engine: Any, input_names: Sequence[str], output_names: Sequence[str], device: str,
                 cuda_graphs: bool = True, device_index: Optional[int] = None):
        super().__init__()
        self.engine = engine
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.device = device
        # The GPU the engine runs on (its context's stream and buffers live there): the current CUDA
        # device when none is named. Each call runs there; inputs from elsewhere are copied to it
        # and the outputs copied back to the inputs' device.
        self.device_index: Optional[int] = None
        self._torch_device: Any = None
        if device == "cuda":
            self.device_index = torch.cuda.current_device() if device_index is None else int(device_index)
            self._torch_device = torch.device("cuda", self.device_index)
        # CUDA graphs (the CUDA engine): each call's inputs are copied into buffers the module keeps
        # and its outputs cloned out of them, so the captured graph of a shape replays whatever
        # tensors the caller passes (Torch-TensorRT's cudagraphs mode does the same). False binds
        # the caller's tensors and fresh outputs in place and launches the kernels one by one.
        self.cuda_graphs = bool(cuda_graphs)
        with self._on_device():
            self._context = engine.create_execution_context()
        self._stage: Dict[str, "torch.Tensor"] = {}  # name -> flat buffer, grown to the largest call
        self._staged_done: Any = None  # a CUDA event after the last staged run's reads of the buffers
        self._staged_key: Any = None  # the last staged call's input shapes, bound in the context
        self._staged_device: Any = None
        self._staged_stream: Any = None  # the stream of the last staged run (its order covers the next)
        self._staged_views: Any = None  # its (input views, output views) of the buffers
        self._dtypes: Dict[str, Any] = {}  # IO name -> torch dtype, filled as calls need them
        # Inputs the engine takes channels-last ([N, H, W, C]; Input's format): each call's
        # (N, C, H, W) tensor is passed as its permuted view, in place where it is channels-last.
        self.channels_last_inputs: List[str] = []

    def _on_device(self) -> Any:
        return _on_gpu(self.device_index)

    def _dtype(self, name: str) -> Any:
        got = self._dtypes.get(name)
        if got is None:
            got = self._dtypes[name] = _torch_dtype(self.engine.tensor_dtype(name))
        return got

    def output_shapes(self) -> Dict[str, List[str]]:
        """Each output's shape as formulas over the inputs' dim names (kiln's symbolic dims)."""
        return {n: list(self.engine.tensor_symbolic_shape(n)) for n in self.output_names}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) + len(kwargs) != len(self.input_names):
            raise InvalidArgumentError(f"kiln.torch: the engine takes {len(self.input_names)} inputs "
                                       f"({', '.join(self.input_names)}), got {len(args) + len(kwargs)}")
        feeds = dict(zip(self.input_names, args))
        for k, v in kwargs.items():
            if k not in self.input_names or k in feeds:
                raise InvalidArgumentError(f"kiln.torch: unexpected or repeated input '{k}' "
                                           f"(inputs: {', '.join(self.input_names)})")
            feeds[k] = v
        out_device = None
        for name, t in feeds.items():
            if not isinstance(t, torch.Tensor):
                raise InvalidArgumentError(f"kiln.torch: input '{name}' is a {type(t).__name__}, not a torch tensor")
            if out_device is None:
                out_device = t.device
            want = self._dtype(name)
            t = t.detach()
            if t.dtype != want:
                t = t.to(want)
            if self.channels_last_inputs and name in self.channels_last_inputs:
                if t.dim() != 4:
                    raise InvalidArgumentError(f"kiln.torch: input '{name}' is taken channels-last and must be 4-D "
                                               f"(N, C, H, W), got shape {tuple(t.shape)}")
                t = t.permute(0, 2, 3, 1)
            feeds[name] = t
        if self.device == "cuda":
            with self._on_device():
                result = self._run_cuda(feeds, out_device)
        else:
            feeds = {n: (t if t.device.type == "cpu" else t.cpu()).contiguous() for n, t in feeds.items()}
            outs = self._context.run(feeds)
            result = tuple(_from_numpy(outs[n]).to(out_device) for n in self.output_names)
        return result[0] if len(result) == 1 else result

    def _run_cuda(self, feeds: Dict[str, "torch.Tensor"], out_device: Any) -> Tuple["torch.Tensor", ...]:
        """Binds the inputs' device memory and torch.empty outputs, and enqueues the engine on the
        current torch stream: no copy, no synchronization, ordered after the inputs' producers and
        before the outputs' readers as any torch op is. Host inputs are moved to the GPU first and
        the outputs moved back."""
        device = self._torch_device
        ctx = self._context
        if self.cuda_graphs:
            staged = self._run_staged(feeds, out_device, device)
            if staged is not None:
                return staged
        ctx.use_cuda_graph = False
        self._staged_key = None  # the addresses bound below replace the buffers'
        keep = []  # the bound tensors stay alive until the run is enqueued (the stream orders the rest)
        for name, t in feeds.items():
            t = t.to(device).contiguous()
            keep.append(t)
            ctx.set_input_shape(name, tuple(t.shape))
            ctx.set_tensor_address(name, t.data_ptr())
        shapes = [tuple(ctx.tensor_shape(name)) for name in self.output_names]
        if any(d < 0 for s in shapes for d in s):
            # An output sized by its data (torch.nonzero): the run allocates it once it knows the
            # size, on the current torch stream.
            result = ctx.run(dict(zip(feeds.keys(), keep)), stream=torch.cuda.current_stream(device))
            outs = tuple(result[n] for n in self.output_names)
            if out_device is not None and out_device != device:
                return tuple(o.to(out_device) for o in outs)
            return outs
        outs = []
        for name, shape in zip(self.output_names, shapes):
            o = torch.empty(shape, dtype=self._dtype(name), device=device)
            ctx.set_tensor_address(name, o.data_ptr())
            outs.append(o)
        ctx.execute_async_v3(torch.cuda.current_stream(device).cuda_stream)
        if out_device is not None and out_device != device:
            return tuple(o.to(out_device) for o in outs)
        return tuple(outs)

    def _buffer(self, name: str, numel: int, device: Any) -> "torch.Tensor":
        """The flat staging buffer of `name`, at least `numel` elements (grown, never shrunk: its
        address, and so the captured graphs, change only when a call is the largest yet)."""
        buf = self._stage.get(name)
        if buf is None or buf.numel() < numel or buf.device != device:
            buf = torch.empty(max(numel, 1), dtype=self._dtype(name), device=device)
            self._stage[name] = buf
            self._staged_key = None  # the context's bound addresses and the views are stale
        return buf

    def _stage_for_the_largest_shapes(self, device: Any) -> None:
        """Buffers for the profile's max input shapes and the output shapes they imply, made once:
        their addresses stay, so each shape's graph is captured once (a buffer grown later for a
        larger output moves, and its graphs are captured again)."""
        ctx = self._context
        try:
            for name in self.input_names:
                ctx.set_input_shape(name, tuple(self.engine.get_tensor_profile_shape(name, 0)[2]))
            for name in self.input_names + self.output_names:
                shape = tuple(ctx.tensor_shape(name))
                if all(d >= 0 for d in shape):
                    self._buffer(name, _numel(shape), device)
        except Error:  # shape-value inputs and the like: the buffers grow with the calls instead
            pass

    def _run_staged(self, feeds: Dict[str, "torch.Tensor"], out_device: Any,
                    device: Any) -> Optional[Tuple["torch.Tensor", ...]]:
        """The CUDA-graph path: inputs copied into the staging buffers, the engine replayed from its
        graph for this shape, outputs cloned out, all on the current torch stream. None where the
        engine's outputs are sized by their data (no graph runs those). A call of the last call's
        shapes only copies, launches and clones: the context keeps its shapes and addresses."""
        ctx = self._context
        stream = torch.cuda.current_stream(device)
        if self._staged_done is not None and self._staged_stream != stream:
            stream.wait_event(self._staged_done)  # a run on another stream may still read the buffers
        key = tuple(tuple(t.shape) for t in feeds.values())
        if self._staged_key != key or self._staged_device != device:
            self._staged_key = None
            if not self._stage:
                self._stage_for_the_largest_shapes(device)
            for name, t in feeds.items():
                self._buffer(name, t.numel(), device)
                ctx.set_input_shape(name, tuple(t.shape))
            shapes = [tuple(ctx.tensor_shape(name)) for name in self.output_names]
            if any(d < 0 for s in shapes for d in s):
                return None
            for name, shape in zip(self.output_names, shapes):
                self._buffer(name, _numel(shape), device)
            for name, buf in self._stage.items():
                ctx.set_tensor_address(name, buf.data_ptr())
            ctx.use_cuda_graph = True
            sized = [(name, tuple(t.shape)) for name, t in feeds.items()] + list(zip(self.output_names, shapes))
            views = [self._stage[name][:_numel(shape)].view(shape) for name, shape in sized]
            self._staged_views = (views[:len(feeds)], views[len(feeds):])
            self._staged_key, self._staged_device = key, device
        ins, outs = self._staged_views
        for view, t in zip(ins, feeds.values()):
            view.copy_(t)
        ctx.execute_async_v3(stream.cuda_stream)
        target = out_device if out_device is not None else device
        result = tuple(o.to(target) if target != device else o.clone() for o in outs)
        if self._staged_done is None:
            self._staged_done = torch.cuda.Event()
        self._staged_done.record(stream)
        self._staged_stream = stream
        return result


# The engine's IO dtypes (numpy's) as torch's.
_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
                 np.dtype(np.float64): torch.float64, np.dtype(np.int64): torch.int64,
                 np.dtype(np.int32): torch.int32, np.dtype(np.int8): torch.int8, np.dtype(np.uint8): torch.uint8,
                 np.dtype(np.bool_): torch.bool}
try:  # the bindings give bfloat16 tensors ml_dtypes' dtype (numpy has none)
    import ml_dtypes

    _TORCH_DTYPES[np.dtype(ml_dtypes.bfloat16)] = torch.bfloat16
except ImportError:  # then no engine of this process reports a bfloat16 tensor either
    pass


def _numel(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _from_numpy(a: "np.ndarray") -> "torch.Tensor":
    """A torch tensor over a host output; bfloat16 (ml_dtypes', which torch.from_numpy refuses) by
    its bits."""
    if _torch_dtype(a.dtype) == torch.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _torch_dtype(np_dtype: Any) -> Any:
    got = _TORCH_DTYPES.get(np.dtype(np_dtype))
    if got is None:
        raise InvalidArgumentError(f"kiln.torch: no torch dtype for the engine's {np_dtype}")
    return got


def compile(module: Any, inputs: Sequence[Input], *, enabled_precisions: Optional[Iterable[Any]] = None,
            device: Union[str, "torch.device"] = "cpu", builder_optimization_level: Optional[int] = None,
            allow_tf32: bool = False, cuda_graphs: bool = True) -> CompiledModule:
    """Builds a kiln engine for `module` over the Inputs' shape ranges; see the module's text.

    enabled_precisions: torch dtypes (torch.float16, torch.bfloat16; torch.float32 is always on)
    the builder may compute in. device: "cpu", "cuda" (the module's GPU where it is on one, else the
    current device), "cuda:N" or a torch.device; the engine is built and runs there. allow_tf32:
    let float32 matrix products and convolutions use TF32 tensor cores; off by default, so float32
    means float32 (kiln's C++ BuilderConfig, like TensorRT's, has TF32 on). cuda_graphs: on a CUDA
    engine, replay each shape's captured CUDA graph, the inputs copied into buffers the module keeps
    and the outputs cloned out (CompiledModule's text); False runs on the caller's tensors in place,
    launching kernel by kernel.
    """
    inputs = list(inputs)
    if not inputs or not all(isinstance(i, Input) for i in inputs):
        raise InvalidArgumentError("kiln.torch.compile: inputs must be a non-empty list of kiln.torch.Input")
    names = [inp.name or f"input_{k}" for k, inp in enumerate(inputs)]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"kiln.torch.compile: input names repeat: {names}")
    kind, index = _parse_device(device, "kiln.torch.compile")
    _check_gpu(index, "kiln.torch.compile")
    if kind == "cuda" and index is None:
        held = _held(module)[0]
        index = held.index if held.type == "cuda" and held.index is not None else torch.cuda.current_device()
    if hasattr(module, "eval"):
        module = module.eval()
    module_cl = _channels_last_module(module)
    flags = [_takes_channels_last(inp, module_cl) for inp in inputs]
    engine_inputs = [_nhwc(inp) if f else inp for inp, f in zip(inputs, flags)]
    with torch.no_grad():
        data = _export(_ChannelsLastInputs(module, flags) if any(flags) else module, engine_inputs, names)
    with _source_lines(data), _on_gpu(index):
        compiled = _build(data, engine_inputs, names, enabled_precisions, kind, builder_optimization_level,
                          allow_tf32, cuda_graphs)
    compiled.channels_last_inputs = [n for n, f in zip(names, flags) if f]
    return compiled


def _parse_device(device: Any, where: str) -> Tuple[str, Optional[int]]:
    """("cpu", None), ("cuda", None) for "cuda", ("cuda", N) for "cuda:N" or torch.device("cuda", N)."""
    try:
        d = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise InvalidArgumentError(f"{where}: device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, "
                                   f"got {device!r}") from e
    if d.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"{where}: device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}")
    return d.type, (d.index if d.type == "cuda" else None)


def _check_gpu(index: Optional[int], where: str) -> None:
    if index is None:
        return
    count = torch.cuda.device_count()
    if index >= count:
        raise InvalidArgumentError(f"{where}: device cuda:{index} does not exist: torch sees {count} CUDA device(s)")


def _on_gpu(index: Optional[int]) -> Any:
    """A context that makes GPU `index` CUDA's current device (nothing for None or where it is already)."""
    if index is None or torch.cuda.current_device() == index:
        return contextlib.nullcontext()
    return torch.cuda.device(index)


def _build(data: bytes, inputs: List[Input], names: List[str], enabled_precisions: Optional[Iterable[Any]],
           device: str, builder_optimization_level: Optional[int], allow_tf32: bool,
           cuda_graphs: bool = True) -> CompiledModule:
    network = _onnx.parse_bytes(data)
    config = _kiln.BuilderConfig()
    if not allow_tf32:
        config.clear_flag(_kiln.BuilderFlag.TF32)
    for p in enabled_precisions or ():
        key = str(p).replace("torch.", "")
        if key in ("float32", "float"):
            continue
        if key not in _PRECISIONS:
            raise InvalidArgumentError(f"kiln.torch.compile: enabled_precisions has {p}; kiln takes "
                                       "torch.float32, torch.float16 and torch.bfloat16")
        config.set_flag(_PRECISIONS[key])
    if builder_optimization_level is not None:
        config.builder_optimization_level = int(builder_optimization_level)
    config.add_profile(_profile(inputs, names))
    engine = _kiln.Builder(_kiln.Device.CUDA if device == "cuda" else _kiln.Device.CPU).build(network, config)
    outputs = [engine.io_tensor_name(i) for i in range(engine.num_io_tensors)
               if engine.tensor_mode(engine.io_tensor_name(i)) == _kiln.TensorIOMode.OUTPUT]
    return CompiledModule(engine, names, outputs, device, cuda_graphs)


_MAGIC = b"KILNTORCH1\n"


def save(compiled: CompiledModule, path: Union[str, "os.PathLike[str]"]) -> None:
    """Writes the compiled module: a small header (IO names, device) and the engine file's bytes."""
    if not isinstance(compiled, CompiledModule):
        raise InvalidArgumentError(f"kiln.torch.save: expected a CompiledModule, got {type(compiled).__name__}")
    header = json.dumps({"inputs": compiled.input_names, "outputs": compiled.output_names,
                         "device": compiled.device,
                         "channels_last_inputs": compiled.channels_last_inputs}).encode()
    write_regular(path, _MAGIC + struct.pack("<Q", len(header)) + header +
                  bytes(compiled.engine.serialize()), "kiln.torch.save")


def load(path: Union[str, "os.PathLike[str]"], device: Union[str, "torch.device", None] = None) -> CompiledModule:
    """Reads what save wrote; runs without the module's Python class (or torch.export). device: None
    (the device kind it was compiled for; a CUDA engine on the current GPU), "cuda:N" or a
    torch.device to load a CUDA engine onto another GPU (of the same kind, as any kiln engine file)."""
    with open_regular(path, "kiln.torch.load") as f:
        head = f.read(len(_MAGIC) + 8)
        if len(head) < len(_MAGIC) + 8 or head[:len(_MAGIC)] != _MAGIC:
            raise InvalidArgumentError(f"kiln.torch.load: '{path}' is not a file kiln.torch.save wrote")
        (n,) = struct.unpack("<Q", head[len(_MAGIC):])
        if n > 1 << 20:
            raise InvalidArgumentError(f"kiln.torch.load: '{path}' has a header of {n} bytes (at most 1 MiB)")
        try:
            meta = json.loads(f.read(n))
            inputs, outputs, saved = list(meta["inputs"]), list(meta["outputs"]), str(meta["device"])
            channels_last = [str(n) for n in meta.get("channels_last_inputs", [])]
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidArgumentError(f"kiln.torch.load: '{path}' has a corrupted header: {e}") from e
        if saved not in ("cpu", "cuda"):
            raise InvalidArgumentError(f"kiln.torch.load: '{path}' has a corrupted header: device {saved!r}")
        kind, index = (saved, None) if device is None else _parse_device(device, "kiln.torch.load")
        if kind != saved:
            raise InvalidArgumentError(f"kiln.torch.load: '{path}' holds an engine built for {saved}; it cannot "
                                       f"load onto {device}")
        _check_gpu(index, "kiln.torch.load")
        with _on_gpu(index):
            engine = _kiln.Engine.deserialize(f.read())
    names = [engine.io_tensor_name(i) for i in range(engine.num_io_tensors)]
    if sorted(names) != sorted(inputs + outputs):
        raise InvalidArgumentError(f"kiln.torch.load: '{path}': the header's IO names {inputs + outputs} are not "
                                   f"the engine's {names}")
    if not set(channels_last) <= set(inputs):
        raise InvalidArgumentError(f"kiln.torch.load: '{path}' has a corrupted header: channels-last inputs "
                                   f"{channels_last} are not among the inputs {inputs}")
    loaded = CompiledModule(engine, inputs, outputs, kind, device_index=index)
    loaded.channels_last_inputs = channels_last
    return loaded


# ---- torch.compile(model, backend="kiln") ----


class CompileReport:
    """What the torch.compile backend did with each graph TorchDynamo handed it, in order: kiln
    built an engine for it, or PyTorch runs it (the reason is kept). TorchDynamo splits a model
    at each graph break (a data-dependent Python branch, an unsupported call), so a model with one
    break arrives as two or more graphs."""

    def __init__(self) -> None:
        self.graphs: List[Dict[str, Any]] = []

    def add(self, runner: str, ops: int, reason: str = "") -> None:
        self.graphs.append({"runner": runner, "ops": ops, "reason": reason})

    @property
    def graph_breaks(self) -> int:
        return max(len(self.graphs) - 1, 0)

    @property
    def fallbacks(self) -> List[Dict[str, Any]]:
        return [g for g in self.graphs if g["runner"] == "pytorch"]

    def clear(self) -> None:
        self.graphs.clear()

    def __str__(self) -> str:
        lines = [f"kiln backend: {len(self.graphs)} graphs ({self.graph_breaks} graph breaks), "
                 f"{len(self.graphs) - len(self.fallbacks)} on kiln, {len(self.fallbacks)} on PyTorch"]
        for k, g in enumerate(self.graphs):
            lines.append(f"  graph {k}: {g['ops']} ops on {g['runner']}" + (f" ({g['reason']})" if g["reason"] else ""))
        return "\n".join(lines)


report = CompileReport()


class _TensorArgs(torch.nn.Module):
    """A TorchDynamo graph whose SymInt arguments (the sizes of dynamic dims) are read off the
    tensors instead, so the exporter sees tensors only and the engine takes tensors only."""

    def __init__(self, gm: Any, plan: List[Tuple[str, Any]]):
        super().__init__()
        self.gm = gm
        self.plan = plan
        self.tensor_index = {k: i for i, k in enumerate(k for k, (kind, _) in enumerate(plan) if kind == "tensor")}

    def forward(self, *tensors: Any) -> Any:
        args = []
        for k, (kind, where) in enumerate(self.plan):
            if kind == "tensor":
                args.append(tensors[self.tensor_index[k]])
            else:
                arg, axis = where
                args.append(tensors[self.tensor_index[arg]].shape[axis])
        return self.gm(*args)


def _dynamic_inputs(gm: Any, example_inputs: Sequence[Any],
                    dynamic_max: Optional[int]) -> Tuple[List[Input], List[Tuple[str, Any]]]:
    """The engine's Inputs for a TorchDynamo graph, and per graph argument ("tensor", None) or
    ("sym", (argument, axis)): where a SymInt argument's value is found among the tensors' dims.
    Symbolic dims get the ranges TorchDynamo's shape environment holds for them."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise InvalidArgumentError("its arguments do not match its graph's placeholders")
    inputs: List[Input] = []
    plan: List[Tuple[str, Any]] = []
    found: Dict[str, Tuple[int, int]] = {}  # symbol -> (argument, axis) of a plain dim
    wanted: List[Tuple[int, str]] = []
    for k, (node, example) in enumerate(zip(placeholders, example_inputs)):
        value = node.meta.get("example_value")
        if not isinstance(example, torch.Tensor):
            if not isinstance(value, torch.SymInt) or not value.node.expr.is_Symbol:
                raise InvalidArgumentError(f"its argument {node.name} is a {type(example).__name__}, not a tensor "
                                           "or the size of a dynamic dim")
            plan.append(("sym", None))
            wanted.append((k, str(value.node.expr)))
            continue
        plan.append(("tensor", None))
        dims = list(value.shape) if isinstance(value, torch.Tensor) else list(example.shape)
        lo, opt, hi = [int(n) for n in example.shape], [int(n) for n in example.shape], [int(n) for n in example.shape]
        names: List[Optional[str]] = [None] * len(dims)
        for axis, d in enumerate(dims):
            if not isinstance(d, torch.SymInt):
                continue
            expr = d.node.expr
            factor, symbol = 1, expr
            if not expr.is_Symbol:  # K*s: a multiple of K
                coeff, rest = expr.as_coeff_Mul()
                if not (rest.is_Symbol and coeff.is_Integer and int(coeff) > 1):
                    raise InvalidArgumentError(f"dim {axis} of {node.name} is {expr}, which kiln's backend does not "
                                               "range yet (a size or K times one)")
                factor, symbol = int(coeff), rest
            bounds = d.node.shape_env.var_to_range.get(symbol)
            upper = bounds.upper if bounds is not None else None
            upper = int(upper) if getattr(upper, "is_Integer", False) else None  # not int_oo
            if upper is None or upper > 2 ** 31:
                if dynamic_max is None:
                    raise InvalidArgumentError(
                        f"dim {axis} of {node.name} ({symbol}) has no upper bound: give it one with "
                        f"torch._dynamo.mark_dynamic(x, {axis}, min=..., max=...), or options={{'dynamic_max': N}}")
                upper = int(dynamic_max) // factor
            lower = max(int(bounds.lower), 1) if bounds is not None else 1
            lo[axis], hi[axis] = factor * lower, factor * max(upper, lower)
            names[axis] = str(symbol) if factor == 1 else f"{factor}*{symbol}"
            if factor == 1:
                found.setdefault(str(symbol), (k, axis))
        if any(n is not None for n in names):
            inputs.append(Input(min_shape=lo, opt_shape=opt, max_shape=hi, dtype=example.dtype, name=f"arg{k}",
                                dim_names=names))
        else:
            inputs.append(Input(shape=tuple(example.shape), dtype=example.dtype, name=f"arg{k}"))
    for k, symbol in wanted:
        if symbol not in found:
            raise InvalidArgumentError(f"its size argument {symbol} is no dim of a tensor argument")
        plan[k] = ("sym", found[symbol])
    return inputs, plan


def backend(gm: Any, example_inputs: Sequence[Any], options: Optional[Dict[str, Any]] = None,
            mode: Optional[str] = None) -> Any:
    """The torch.compile backend (registered as "kiln" through the torch_dynamo_backends entry
    point): each graph TorchDynamo captures becomes a kiln engine for its example inputs' shapes,
    or, where kiln cannot take it, stays with PyTorch with a KilnWarning saying why. Options:
    device ("cpu", "cuda" or "cuda:N"), enabled_precisions, allow_tf32 and cuda_graphs (as
    compile's), dynamic_max (the largest size of a dynamic dim that TorchDynamo left unbounded), fallback (default True; False
    makes a graph kiln cannot take an error instead of a KilnWarning). kiln.torch.report says what ran
    where, graph breaks included.

    Dynamic shapes: a graph whose dims TorchDynamo made symbolic (torch._dynamo.mark_dynamic(x, d,
    min=, max=), dynamic=True, or a recompilation after a shape changed) becomes one engine whose
    profile spans each symbol's range (a dim shared by several inputs is one symbol; K*s dims
    stay multiples of K), opt at the example's size. A symbol without an upper bound takes
    dynamic_max, and without it the graph stays with PyTorch, saying which dim needs a range."""
    opts = dict(options or {})
    device = opts.pop("device", "cpu")
    fallback = bool(opts.pop("fallback", True))
    precisions = opts.pop("enabled_precisions", None)
    allow_tf32 = bool(opts.pop("allow_tf32", False))
    dynamic_max = opts.pop("dynamic_max", None)
    cuda_graphs = bool(opts.pop("cuda_graphs", True))
    if opts:
        raise InvalidArgumentError(f"kiln backend: unknown options {sorted(opts)} (it takes device, "
                                   "enabled_precisions, allow_tf32, dynamic_max, fallback, cuda_graphs)")
    ops = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
    output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    as_list = isinstance(output, list)

    def fall_back(reason: str) -> Any:
        if not fallback:
            raise Error(f"kiln backend: a graph of {ops} ops cannot run on kiln (options fallback=False): {reason}")
        report.add("pytorch", ops, reason)
        warnings.warn(KilnWarning(f"kiln backend: a graph of {ops} ops runs on PyTorch: {reason}"), stacklevel=2)
        return gm.forward

    if not isinstance(output, (tuple, list)) or not all(hasattr(o, "op") for o in output):
        return fall_back("its output is not a flat sequence of tensors")
    try:
        tensors, plan = _dynamic_inputs(gm, example_inputs, dynamic_max)
    except InvalidArgumentError as e:
        return fall_back(str(e))
    tensor_positions = [k for k, (kind, _) in enumerate(plan) if kind == "tensor"]
    dynamic = any(kind == "sym" for kind, _ in plan)

    def build() -> Any:
        try:
            module = _TensorArgs(gm, plan) if dynamic else gm
            on = next((t.device for t in example_inputs if isinstance(t, torch.Tensor)), None)
            if on is not None and on.type != "cpu":
                module._kiln_example_device = on
            compiled = compile(module, tensors, enabled_precisions=precisions, device=device, allow_tf32=allow_tf32,
                               cuda_graphs=cuda_graphs)
        except Exception as e:  # unsupported op, export failure: PyTorch keeps the graph
            return fall_back(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        report.add("kiln", ops)
        if report.graph_breaks:
            warnings.warn(KilnWarning(str(report)), stacklevel=3)

        def run(*args: Any) -> Any:
            out = compiled(*[args[k] for k in tensor_positions])
            out = list(out) if isinstance(out, tuple) else [out]
            return out if as_list else tuple(out)

        return run

    if not dynamic:
        return build()
    # A graph with size arguments is exported at its first call, outside TorchDynamo's compilation:
    # torch.export run from inside it left a guard that failed on the frame being compiled.
    state: Dict[str, Any] = {}

    def first_call(*args: Any) -> Any:
        if "run" not in state:
            state["run"] = build()
        return state["run"](*args)

    return first_call


def _register_with_dynamo() -> None:
    """`import kiln.torch` makes torch.compile(backend="kiln") work wherever the package comes from
    (a source path or a copied folder has no entry point). The installed package's entry point
    names kiln._dynamo.backend, which imports this module only when a graph is compiled, so the
    two registrations never meet halfway (torch's lookup registers an entry point after loading
    it, and refuses a name twice)."""
    try:
        from torch._dynamo.backends import registry  # noqa: PLC0415
    except ImportError:  # a torch without TorchDynamo: kiln.torch.compile still works
        return
    # An entry point naming this module itself (a package installed before kiln._dynamo existed)
    # is being loaded by torch's lookup, which registers it next: registering here would make
    # that a duplicate.
    entry = registry._BACKENDS.get("kiln")
    if str(getattr(entry, "value", "")).startswith("kiln.torch"):
        return
    if "kiln" not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=backend, name="kiln")


_register_with_dynamo()
