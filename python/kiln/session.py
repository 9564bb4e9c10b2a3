"""kiln.session: ONNX Runtime's InferenceSession, run by kiln engines.

    sess = kiln.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    (y,) = sess.run(None, {name: x})

The session composes library calls: it builds an engine whose single profile covers the input
shapes seen so far. A model whose inputs are all static is built at once for those shapes; otherwise
the first run builds for exactly its shapes, and a later run with a dim outside the profile rebuilds
with the profile grown to cover old and new (min of mins, max of maxes, opt = the new shapes), saying
so with a KilnWarning (an engine found in the cache instead is logged on the "kiln" logger).

Engines are cached on disk under $KILN_CACHE_DIR (default ~/.cache/kiln), keyed by everything that
changes the engine: the model's bytes and its external data, the profile, the builder flags, kiln's
version, engine format and extension binary, and the device. A later session on the same model and
shapes loads the engine instead of building it (InferenceSession.builds and .cache_hits count
both). Cache writes are atomic (a temporary file renamed into place); an unreadable cache file is
rebuilt and replaced. For CUDA the key also holds the GPU models nvidia-smi lists (the engine file
does not record the GPU); CPU engines pick their instruction set when they run, so they need none.

Providers map to kiln devices: CPUExecutionProvider -> CPU; CUDAExecutionProvider and
TensorrtExecutionProvider -> CUDA when this build of kiln has it. As in ONNX Runtime, a provider
that cannot be used is skipped with a warning and the CPU is the last resort. sess_options,
provider_options and run_options are accepted for compatibility and ignored.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import pathlib
import sys
import threading
import time
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _kiln
from . import onnx as _onnx
from ._errors import Error, InvalidArgumentError, NotFoundError
from ._files import write_regular
from ._kiln import Builder, BuilderConfig, Device, Engine, Network, OptimizationProfile

__all__ = ["InferenceSession", "KilnWarning", "NodeArg", "get_available_providers"]

_log = logging.getLogger("kiln")

Shape = Tuple[int, ...]
# input name -> (min, opt, max)
Profile = Dict[str, Tuple[Shape, Shape, Shape]]

_PROVIDER_DEVICES = {
    "CPUExecutionProvider": Device.CPU,
    "CUDAExecutionProvider": Device.CUDA,
    "TensorrtExecutionProvider": Device.CUDA,
}

# kiln dtype names -> ONNX Runtime's type strings ('tensor(float)').
_ORT_TYPE_NAMES = {"float32": "float", "float64": "double"}


class KilnWarning(UserWarning):
    """What InferenceSession warns about: provider fallbacks, engine rebuilds, cache trouble."""


class NodeArg:
    """An input or output as ONNX Runtime describes it: name, shape (ints for fixed dims, strings
    for symbolic ones, None where unknown) and type ('tensor(float)')."""

    def __init__(self, name: str, shape: Optional[List[Union[int, str, None]]], type: str):
        self.name = name
        self.shape = shape
        self.type = type

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


def get_available_providers() -> List[str]:
    """onnxruntime.get_available_providers(): the providers this build of kiln can serve."""
    gpu = ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
    return (gpu if _kiln.device_available(Device.CUDA) else []) + ["CPUExecutionProvider"]


def _ort_dim(d: str) -> Union[int, str]:
    return int(d) if d.lstrip("-").isdigit() else d


def _ort_type(dtype_name: str) -> str:
    return f"tensor({_ORT_TYPE_NAMES.get(dtype_name, dtype_name)})"


def _sha256_file(path: "os.PathLike[str] | str") -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _extension_hash() -> str:
    """The compiled extension's hash: a rebuilt kiln with the same version string still gets
    engines of its own."""
    return _sha256_file(_kiln.__file__)


def _external_data_key(path: pathlib.Path) -> List[Tuple[str, str]]:
    """The external data files the model names, with their hashes. Without the onnx package the
    files cannot be named, so every file beside the model counts, by size and mtime."""
    folder = path.parent
    try:
        import onnx
        from onnx.external_data_helper import _get_all_tensors
    except ImportError:
        return sorted((p.name, f"{p.stat().st_size}:{p.stat().st_mtime_ns}")
                      for p in folder.iterdir() if p.is_file() and p != path)
    model = onnx.load(str(path), load_external_data=False)
    names = set()
    for tensor in _get_all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            names.update(e.value for e in tensor.external_data if e.key == "location")
    key = []
    for name in sorted(names):
        file = folder / name
        key.append((name, _sha256_file(file) if file.is_file() else "absent"))
    return key


@functools.lru_cache(maxsize=None)
def _gpu_identity() -> str:
    """The GPUs a CUDA engine could be built for, as nvidia-smi names them, with the
    CUDA_VISIBLE_DEVICES that picks among them. kiln's engine file does not record the GPU model,
    so without this a cache shared by two GPU models would hand one the other's engines."""
    import subprocess
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        listed = "nvidia-smi unavailable"
    return f"{listed} | CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}"


def cache_dir() -> pathlib.Path:
    """Where engines are cached: $KILN_CACHE_DIR, else ~/.cache/kiln."""
    return pathlib.Path(os.environ.get("KILN_CACHE_DIR") or pathlib.Path.home() / ".cache" / "kiln")


class InferenceSession:
    """onnxruntime.InferenceSession with kiln engines underneath (see the module docstring)."""

    def __init__(self, path_or_bytes: Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, Any],
                 sess_options: Any = None, providers: Optional[Sequence[Any]] = None,
                 provider_options: Optional[Sequence[Mapping[str, Any]]] = None, **kwargs: Any):
        self._model_proto: Any = None
        self._model_path: Optional[pathlib.Path] = None
        if isinstance(path_or_bytes, (str, os.PathLike)):
            self._model_path = pathlib.Path(path_or_bytes).resolve()
            self._network: Network = _onnx.parse_file(self._model_path)
            model_key: Dict[str, Any] = {"model": _sha256_file(self._model_path),
                                         "external_data": _external_data_key(self._model_path)}
            self._model_bytes: Optional[bytes] = None
        else:
            if hasattr(path_or_bytes, "SerializeToString"):  # an onnx.ModelProto
                self._model_proto = path_or_bytes
                data = path_or_bytes.SerializeToString()
            elif isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
                data = bytes(path_or_bytes)
            else:
                raise TypeError("InferenceSession: expected a model path, the model's bytes or an "
                                f"onnx.ModelProto, got {type(path_or_bytes).__name__}")
            self._network = _onnx.parse_bytes(data)
            self._model_bytes = data
            model_key = {"model": hashlib.sha256(data).hexdigest()}
        self._providers, self._device = self._pick_provider(providers)
        self._config = BuilderConfig()
        self._key_base = {
            **model_key,
            "flags": self._config.flags,
            "device": self._device.name if self._device == Device.CPU else f"CUDA: {_gpu_identity()}",
            "kiln_version": _kiln.kiln_version,
            "engine_format": _kiln.engine_format_version,
            "package": _package_version(),
            "extension": _extension_hash(),
        }
        self._inputs = [self._network.get_input(i) for i in range(self._network.num_inputs)]
        self._input_names = [t.name for t in self._inputs]
        self._output_names = [self._network.get_output(i).name for i in range(self._network.num_outputs)]
        self._outputs_meta: Optional[List[NodeArg]] = None
        self._lock = threading.Lock()
        self._local = threading.local()
        self._engine: Optional[Engine] = None
        self._profile: Optional[Profile] = None
        self.engine_path: Optional[pathlib.Path] = None
        self.builds = 0       # engines this session built
        self.cache_hits = 0   # engines this session loaded from the disk cache
        shapes = {t.name: t.shape for t in self._inputs}
        if all(s is not None and -1 not in s for s in shapes.values()):
            with self._lock:
                self._use_profile({n: (tuple(s),) * 3 for n, s in shapes.items()})

    # ---- ONNX Runtime's metadata -------------------------------------------------------------

    def get_inputs(self) -> List[NodeArg]:
        return [NodeArg(t.name, None if t.symbolic_shape is None else [_ort_dim(d) for d in t.symbolic_shape],
                        _ort_type(t.dtype_name)) for t in self._inputs]

    def get_outputs(self) -> List[NodeArg]:
        """Output shapes as the model declares them (read with the onnx package when it is
        installed), else as the current engine infers them, else None."""
        if self._outputs_meta is None:
            declared = self._declared_output_shapes()
            meta = []
            for i, name in enumerate(self._output_names):
                shape = declared.get(name) if declared is not None else None
                if shape is None and self._engine is not None:
                    shape = [_ort_dim(d) for d in self._engine.tensor_symbolic_shape(name)]
                meta.append(NodeArg(name, shape, _ort_type(self._network.get_output(i).dtype_name)))
            if declared is None and self._engine is None:
                return meta  # shapes may still come from an engine: do not keep this answer
            self._outputs_meta = meta
        return list(self._outputs_meta)

    def get_providers(self) -> List[str]:
        return list(self._providers)

    def get_provider_options(self) -> Dict[str, Dict[str, str]]:
        return {p: {} for p in self._providers}

    # ---- what kiln adds ------------------------------------------------------------------------

    @property
    def engine(self) -> Optional[Engine]:
        """The engine runs use now; None until the first run of a model with dynamic inputs."""
        return self._engine

    @property
    def profile(self) -> Optional[Profile]:
        """The current engine's profile: input name -> (min, opt, max)."""
        return None if self._profile is None else dict(self._profile)

    # ---- running -------------------------------------------------------------------------------

    def run(self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, Any],
            run_options: Any = None) -> List[np.ndarray]:
        """Runs on input_feed (input name -> array) and returns the outputs named in
        output_names, in that order (all outputs for None or [])."""
        feeds = self._check_feed(input_feed)
        unknown = [n for n in output_names or () if n not in self._output_names]
        if unknown:
            raise NotFoundError(f"run(): the model has no output named {', '.join(map(repr, unknown))} "
                                f"(its outputs: {', '.join(self._output_names)})")
        with self._lock:
            self._cover({n: tuple(int(d) for d in a.shape) for n, a in feeds.items()})
            engine = self._engine
        local = self._local
        if getattr(local, "engine", None) is not engine:  # one context per thread and engine
            local.engine, local.context = engine, engine.create_execution_context()
        return local.context.run(list(output_names) if output_names else None, feeds)

    def _check_feed(self, input_feed: Mapping[str, Any]) -> Dict[str, Any]:
        if not isinstance(input_feed, Mapping):
            raise InvalidArgumentError("run(): input_feed must be a dict of input name -> array, got "
                                       f"{type(input_feed).__name__}")
        unknown = [n for n in input_feed if n not in self._input_names]
        if unknown:
            raise NotFoundError(f"run(): the model has no input named {', '.join(map(repr, unknown))} "
                                f"(its inputs: {', '.join(self._input_names)})")
        missing = [n for n in self._input_names if n not in input_feed]
        if missing:
            raise InvalidArgumentError(f"run(): missing input(s): {', '.join(missing)}")
        feeds = {}
        for t in self._inputs:
            a = input_feed[t.name]
            if not isinstance(a, np.ndarray):
                # Lists become arrays; host DLPack objects (torch, jax) are viewed, not copied. Device
                # tensors pass through to the context, whose error says what it accepts.
                host = not hasattr(a, "__dlpack_device__") or a.__dlpack_device__()[0] in (1, 3)
                if host:
                    a = np.from_dlpack(a) if hasattr(a, "__dlpack__") else np.asarray(a)
            shape = tuple(int(d) for d in a.shape)
            if t.symbolic_shape is not None:
                if len(shape) != len(t.symbolic_shape):
                    raise InvalidArgumentError(f"input '{t.name}' has rank {len(shape)}, but the model's is "
                                               f"{len(t.symbolic_shape)} ({', '.join(t.symbolic_shape)})")
                for i, (got, want) in enumerate(zip(shape, t.shape)):
                    if want != -1 and got != want:
                        raise InvalidArgumentError(f"input '{t.name}' dim {i} is {got}, but the model "
                                                   f"fixes it at {want} (shape given: {shape})")
            if isinstance(a, np.ndarray) and t.dtype_name != "undefined" and str(a.dtype) != t.dtype_name:
                raise InvalidArgumentError(f"input '{t.name}' has dtype {a.dtype}, but the model takes "
                                           f"{t.dtype_name}: kiln never converts dtypes silently")
            feeds[t.name] = a
        return feeds

    # ---- profiles and engines ------------------------------------------------------------------

    def _dim_label(self, name: str, axis: int) -> str:
        sym = next(t.symbolic_shape for t in self._inputs if t.name == name)
        if sym is not None and isinstance(_ort_dim(sym[axis]), str):
            return sym[axis]
        return f"dim {axis}"

    def _cover(self, shapes: Dict[str, Shape]) -> None:
        """Makes the engine's profile cover `shapes`, building or loading an engine if it must."""
        if self._profile is None:
            self._use_profile({n: (s, s, s) for n, s in shapes.items()})
            return
        outside = []
        grown: Profile = {}
        for name, shape in shapes.items():
            lo, _, hi = self._profile[name]
            if len(shape) != len(lo):  # only where the model leaves the rank open
                self._use_profile({n: (s, s, s) for n, s in shapes.items()},
                                  reason=f"input '{name}' of rank {len(shape)} (was {len(lo)})")
                return
            for axis, (d, a, b) in enumerate(zip(shape, lo, hi)):
                if not a <= d <= b:
                    label = self._dim_label(name, axis)
                    outside.append(f"input '{name}' {label} {d} outside profile [{a}, {b}]")
            grown[name] = (tuple(map(min, lo, shape)), shape, tuple(map(max, hi, shape)))
        if not outside:
            return
        try:
            self._use_profile(grown, reason="; ".join(outside))
        except Error as e:
            # The builder proves each node valid over the whole box; a grown box can break a node
            # (e.g. a dim that must stay even) where the shapes themselves are fine.
            _warn(f"kiln: the grown profile does not build ({e}); building for exactly these shapes")
            self._use_profile({n: (s, s, s) for n, s in shapes.items()})

    def _cache_key(self, profile: Profile) -> str:
        parts = dict(self._key_base, profile={n: [list(s) for s in p] for n, p in sorted(profile.items())})
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:40]

    def _use_profile(self, profile: Profile, reason: str = "") -> None:
        """Loads the engine for `profile` from the cache, or builds and caches it. A build for
        `reason` (shapes outside the old profile) says so with a KilnWarning; a cache hit logs."""
        stem = self._model_path.stem if self._model_path else "model"
        folder = cache_dir()
        path = folder / f"{stem}-{self._device.name.lower()}-{self._cache_key(profile)}.kiln"
        engine = None
        if path.is_file():
            try:
                engine = Engine.load(path)
                self.cache_hits += 1
                _log.info("kiln: loaded engine from cache %s%s", path, f" for {reason}" if reason else "")
            except Error as e:
                _warn(f"kiln: engine cache file {path} is unusable ({e}); rebuilding it")
        if engine is None:
            if reason:
                _warn(f"kiln: rebuilding engine for {reason}")
            config = BuilderConfig()
            optimization_profile = OptimizationProfile()
            for name, (lo, opt, hi) in profile.items():
                optimization_profile.set_dimensions(name, lo, opt, hi)
            config.add_profile(optimization_profile)
            start = time.perf_counter()
            engine = Builder(self._device).build(self._network, config)
            self.builds += 1
            _log.info("kiln: built engine for %s in %.2f s", profile, time.perf_counter() - start)
            _write_atomically(path, engine.serialize())
        self._engine, self._profile, self.engine_path = engine, profile, path

    def _declared_output_shapes(self) -> Optional[Dict[str, Optional[List[Union[int, str, None]]]]]:
        try:
            import onnx
        except ImportError:
            return None
        if self._model_proto is not None:
            model = self._model_proto
        elif self._model_path is not None:
            model = onnx.load(str(self._model_path), load_external_data=False)
        else:
            model = onnx.load_from_string(self._model_bytes)
        shapes: Dict[str, Optional[List[Union[int, str, None]]]] = {}
        for vi in model.graph.output:
            tt = vi.type.tensor_type
            if not tt.HasField("shape"):
                shapes[vi.name] = None
                continue
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                               for d in tt.shape.dim]
        return shapes

    # ---- providers -----------------------------------------------------------------------------

    @staticmethod
    def _pick_provider(providers: Optional[Sequence[Any]]) -> Tuple[List[str], "Device"]:
        names = [p[0] if isinstance(p, (tuple, list)) else p for p in (providers or ["CPUExecutionProvider"])]
        for i, name in enumerate(names):
            following = names[i + 1] if i + 1 < len(names) else "CPUExecutionProvider"
            device = _PROVIDER_DEVICES.get(name)
            if device is None:
                _warn(f"kiln: provider {name!r} is not one kiln serves ({', '.join(_PROVIDER_DEVICES)}); "
                      f"falling back to {following}")
                continue
            if not _kiln.device_available(device):
                _warn(f"kiln: {name} needs kiln's {device.name} backend, which this build lacks; "
                      f"falling back to {following}")
                continue
            return [name], device
        return ["CPUExecutionProvider"], Device.CPU


def _warn(message: str) -> None:
    """Warns with a KilnWarning that points at the first caller outside the kiln package."""
    frame, level = sys._getframe(1), 2
    package = os.path.dirname(os.path.abspath(__file__))
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, KilnWarning, stacklevel=level)


def _package_version() -> str:
    from . import __version__
    return __version__


def _write_atomically(path: pathlib.Path, data: bytes) -> None:
    """Writes a cache file so that readers see the old file or the whole new one, never a part
    (_files.write_regular). A cache that cannot be written costs a rebuild next time, not this run."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_regular(path, data, "kiln: the engine cache")
    except (OSError, InvalidArgumentError) as e:
        _warn(f"kiln: could not write the engine cache {path}: {e}")
