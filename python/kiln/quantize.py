"""kiln.quantize: post-training quantization to an explicit Q/DQ ONNX model.

Calibration runs the FP32 model on kiln's CPU engine over a set of feeds and records, for every
activation that enters a Conv, MatMul or Gemm, its absolute maximum and a histogram of its absolute
values. A method turns each into an ``amax``: ``minmax`` (the largest value seen), ``percentile``
(the given percentile of |x|, 99.99 by default) or ``entropy`` (TensorRT's KL-divergence choice of
the clipping threshold over a 2048-bin histogram). The calibration (a JSON cache, reusable and
tied to the model's bytes) then writes a QDQ model the way TensorRT 11 and ONNX Runtime expect one:
activations get QuantizeLinear/DequantizeLinear pairs with a per-tensor symmetric scale
(``amax / 127`` for int8, ``amax / 448`` for float8 e4m3fn, zero point 0), weights are stored
quantized per output channel with one DequantizeLinear each, biases stay float.

    calib = kiln.quantize.Calibrator("model.onnx", method="entropy").calibrate(feeds)
    calib.save("model.calib.json")
    qdq = kiln.quantize.quantize("model.onnx", calib)            # an onnx.ModelProto
    qdq, report = kiln.quantize.quantize_to_budget("model.onnx", calib, holdout, "cosine:0.999")

``quantize_to_budget`` measures each quantized layer's sensitivity (the budget metric with only
that layer quantized), then leaves the most sensitive layers in float, one at a time, until the
metric against the FP32 engine on held-out feeds meets the budget. ``kiln quantize`` (``python -m
kiln.quantize``) does all of this from the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import sys
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ._errors import InvalidArgumentError

__all__ = ["Calibration", "Calibrator", "QUANTIZABLE_OPS", "check_budget", "main", "parse_budget", "quantize",
           "quantize_to_budget"]

# The ops whose inputs are quantized: where TensorRT and ModelOpt put Q/DQ for int8 and fp8.
QUANTIZABLE_OPS = ("Conv", "MatMul", "Gemm")
_METHODS = ("minmax", "percentile", "entropy")
_PRECISIONS = {"int8": 127.0, "fp8": 448.0}  # the largest magnitude each element type holds
_HIST_BINS = 2048
_CACHE_FORMAT = "kiln-calibration"
_CACHE_VERSION = 1


def _onnx():
    try:
        import onnx
    except ImportError as e:  # pragma: no cover - onnx is a dependency of the package
        raise ImportError("kiln.quantize needs the onnx package (pip install onnx)") from e
    return onnx


def _load(model: Any):
    """(ModelProto, the model's serialized bytes) from a path, bytes or a ModelProto."""
    onnx = _onnx()
    if isinstance(model, (str, os.PathLike)):
        path = pathlib.Path(model)
        if not path.is_file():
            raise InvalidArgumentError(f"kiln.quantize: model '{path}' is not a file")
        proto = onnx.load(str(path))
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto = onnx.load_from_string(bytes(model))
    elif hasattr(model, "SerializeToString"):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
    else:
        raise InvalidArgumentError(f"kiln.quantize: a model is a path, bytes or an onnx.ModelProto, not {type(model)}")
    return proto, proto.SerializeToString()


def _model_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _node_names(graph) -> list[str]:
    """Each node's name; nameless nodes get '<op>_<index>' (the name reports and exclusions use)."""
    names, seen = [], set()
    for i, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{i}"
        if name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        names.append(name)
    return names


def _constants(graph) -> dict[str, np.ndarray]:
    """Initializers and Constant nodes' values: the tensors that are weights, not activations."""
    from onnx import numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and len(node.output) == 1:
            for a in node.attribute:
                if a.name == "value":
                    out[node.output[0]] = numpy_helper.to_array(a.t)
    return out


@dataclasses.dataclass
class _Site:
    """A quantizable node: its activation inputs and its weight input (an index, or None)."""

    node: int
    name: str
    op: str
    activations: list[int]
    weight: int | None


def _sites(graph) -> list[_Site]:
    constants = _constants(graph)
    names = _node_names(graph)
    sites = []
    for i, node in enumerate(graph.node):
        if node.op_type not in QUANTIZABLE_OPS:
            continue
        data_inputs = [0, 1]  # Conv X, W; MatMul A, B; Gemm A, B (biases stay float)
        acts, weight = [], None
        for k in data_inputs:
            if k >= len(node.input) or not node.input[k]:
                continue
            value = constants.get(node.input[k])
            if value is not None and value.dtype == np.float32 and k == 1 and weight is None:
                weight = k
            elif value is None:
                acts.append(k)
        if acts or weight is not None:
            sites.append(_Site(i, names[i], node.op_type, acts, weight))
    return sites


def _float_tensors(model) -> set[str]:
    """Names of the tensors onnx's shape inference types float32 (graph inputs included)."""
    onnx = _onnx()
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is a help here; unknown types are checked at run
        inferred = model
    g = inferred.graph
    out = set()
    for v in list(g.input) + list(g.value_info) + list(g.output):
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            out.add(v.name)
    return out


@dataclasses.dataclass
class Calibration:
    """The calibration of one model: each activation's amax under one method (a JSON cache)."""

    model_sha256: str
    method: str
    samples: int
    amax: dict[str, float]
    percentile: float = 99.99

    def to_json(self) -> str:
        return json.dumps({"format": _CACHE_FORMAT, "version": _CACHE_VERSION, "model_sha256": self.model_sha256,
                           "method": self.method, "percentile": self.percentile, "samples": self.samples,
                           "tensors": {k: {"amax": v} for k, v in sorted(self.amax.items())}}, indent=1)

    def save(self, path: str | os.PathLike) -> None:
        pathlib.Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def from_json(cls, text: str, what: str = "calibration cache") -> "Calibration":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidArgumentError(f"{what} is not JSON: {e}") from None
        if not isinstance(d, dict) or d.get("format") != _CACHE_FORMAT:
            raise InvalidArgumentError(f"{what} is not a kiln calibration cache (its 'format' is not '{_CACHE_FORMAT}')")
        if d.get("version") != _CACHE_VERSION:
            raise InvalidArgumentError(f"{what} has version {d.get('version')!r}; this kiln reads {_CACHE_VERSION}")
        tensors = d.get("tensors")
        if not isinstance(tensors, dict):
            raise InvalidArgumentError(f"{what} has no 'tensors' table")
        amax = {}
        for name, entry in tensors.items():
            v = entry.get("amax") if isinstance(entry, dict) else None
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InvalidArgumentError(f"{what}: tensor '{name}' has no finite, non-negative amax ({v!r})")
            amax[name] = float(v)
        method = d.get("method")
        if method not in _METHODS:
            raise InvalidArgumentError(f"{what}: method {method!r} is not one of {', '.join(_METHODS)}")
        return cls(str(d.get("model_sha256", "")), method, int(d.get("samples", 0)), amax,
                   float(d.get("percentile", 99.99)))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Calibration":
        p = pathlib.Path(path)
        if not p.is_file():
            raise InvalidArgumentError(f"calibration cache '{p}' is not a file")
        return cls.from_json(p.read_text(), f"calibration cache '{p}'")

    def check_model(self, model_bytes: bytes, what: str = "the model") -> None:
        if self.model_sha256 != _model_hash(model_bytes):
            raise InvalidArgumentError(
                f"the calibration cache was made for another model (sha256 {self.model_sha256[:16]}..., "
                f"{what} has {_model_hash(model_bytes)[:16]}...): calibrate this model again")


def _entropy_amax(hist: np.ndarray, width: float, levels: int) -> float:
    """TensorRT's entropy calibration: the threshold whose clipped, quantized distribution is
    nearest (by KL divergence) to the observed one. ``hist`` counts |x| in bins of ``width``."""
    hist = hist.astype(np.float64)
    nbins = len(hist)
    if hist.sum() == 0:
        return 0.0
    best_i, best_kl = nbins, math.inf
    tail = np.concatenate([np.cumsum(hist[::-1])[::-1], [0.0]])  # tail[i] = sum(hist[i:])
    for i in range(levels, nbins + 1):
        # P: the distribution clipped at bin i, the clipped values counted in its last bin. Q: the
        # unclipped bins below i merged into `levels` quantized bins and spread back over the bins
        # that were non-empty. Clipping shows as P's mass that Q lacks, rounding as Q's smearing.
        kept = hist[:i]
        p = kept.copy()
        p[-1] += tail[i]
        if kept.sum() == 0:
            continue
        group = (np.arange(i) * levels) // i  # which of the `levels` quantized bins each bin joins
        nonzero = kept > 0
        sums = np.bincount(group, weights=kept, minlength=levels)
        counts = np.bincount(group, weights=nonzero, minlength=levels)
        q = np.where(nonzero, sums[group] / np.maximum(counts[group], 1), 0.0)
        pn, qn = p / p.sum(), q / q.sum()
        mask = pn > 0
        kl = float(np.sum(pn[mask] * np.log(pn[mask] / np.maximum(qn[mask], 1e-12))))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return (best_i + 0.5) * width


def _percentile_amax(hist: np.ndarray, width: float, percentile: float) -> float:
    total = hist.sum()
    if total == 0:
        return 0.0
    k = int(np.searchsorted(np.cumsum(hist), total * percentile / 100.0))
    return min(k + 1, len(hist)) * width


def _feed_list(feeds: Iterable[Mapping[str, Any]], inputs: Sequence[str], what: str) -> list[dict[str, np.ndarray]]:
    out = []
    for n, feed in enumerate(feeds):
        if not isinstance(feed, Mapping):
            raise InvalidArgumentError(f"{what} {n} is a {type(feed).__name__}, not a mapping of input name to array")
        missing = [k for k in inputs if k not in feed]
        extra = [k for k in feed if k not in inputs]
        if missing or extra:
            raise InvalidArgumentError(
                f"{what} {n} does not match the model's inputs ({', '.join(inputs)}): "
                + "; ".join(x for x in (f"missing {', '.join(missing)}" if missing else "",
                                         f"unknown {', '.join(extra)}" if extra else "") if x))
        arrays = {}
        for k in inputs:
            a = np.asarray(feed[k])
            if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
                raise InvalidArgumentError(f"{what} {n}: input '{k}' holds NaN or Inf; calibration data must be finite")
            arrays[k] = a
        out.append(arrays)
    if not out:
        raise InvalidArgumentError(f"no {what}s: calibration needs at least one feed")
    return out


def _graph_inputs(model) -> list[str]:
    inits = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _static_inputs(model) -> set[str]:
    """The graph inputs whose every dim is a number: they have no range for a profile to give."""
    static = set()
    for i in model.graph.input:
        t = i.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            static.add(i.name)
    return static


def _engine(model_bytes: bytes, feeds: Sequence[Mapping[str, np.ndarray]], static: set[str], device: Any = None):
    """A kiln FP32 engine of the model whose one profile holds every feed's shapes; ``static`` is
    the model's _static_inputs (quantize_to_budget builds many engines of one model's variants, so
    the caller reads them once instead of each build parsing the bytes a second time)."""
    from . import Builder, BuilderConfig, Device, OptimizationProfile
    from . import onnx as konnx

    network = konnx.parse_bytes(model_bytes)
    config = BuilderConfig()
    profile = OptimizationProfile()
    for name in feeds[0]:
        shapes = [tuple(f[name].shape) for f in feeds]
        ranks = {len(s) for s in shapes}
        if len(ranks) != 1:
            raise InvalidArgumentError(f"the feeds give input '{name}' different ranks: {sorted(ranks)}")
        if name in static:
            continue  # a static input has no range to give; the run checks each feed's shape
        lo = tuple(int(x) for x in np.min(shapes, axis=0))
        hi = tuple(int(x) for x in np.max(shapes, axis=0))
        profile.set_dimensions(name, lo, hi, hi)
    config.add_profile(profile)
    return Builder(device if device is not None else Device.CPU).build(network, config)


def _run_all(engine, feeds: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[str] | None = None):
    context = engine.create_execution_context()
    for feed in feeds:
        result = context.run(dict(feed))
        yield result if outputs is None else {k: result[k] for k in outputs}


class Calibrator:
    """Collects activation ranges of one model over feeds, on kiln's CPU engine in FP32."""

    def __init__(self, model: Any, method: str = "entropy", percentile: float = 99.99):
        if method not in _METHODS:
            raise InvalidArgumentError(f"calibration method '{method}' is not one of {', '.join(_METHODS)}")
        if not 0.0 < percentile <= 100.0:
            raise InvalidArgumentError(f"percentile {percentile} is outside (0, 100]")
        self.model, self.model_bytes = _load(model)
        self.method, self.percentile = method, percentile

    def tensors(self) -> list[str]:
        """The activations calibration observes: every float input of a quantizable node."""
        g = self.model.graph
        floats = _float_tensors(self.model)
        names = []
        for site in _sites(g):
            for k in site.activations:
                t = g.node[site.node].input[k]
                if t not in names and t in floats:
                    names.append(t)
        return names

    def calibrate(self, feeds: Iterable[Mapping[str, Any]]) -> Calibration:
        onnx = _onnx()
        inputs = _graph_inputs(self.model)
        feeds = _feed_list(feeds, inputs, "calibration feed")
        observed = self.tensors()
        if not observed:
            raise InvalidArgumentError(
                f"the model has no float activation entering a {', '.join(QUANTIZABLE_OPS)} node: nothing to calibrate")
        probe = onnx.ModelProto()
        probe.CopyFrom(self.model)
        present = {o.name for o in probe.graph.output}
        computed = [t for t in observed if t not in inputs]  # graph inputs are read from the feeds
        for t in computed:
            if t not in present:
                probe.graph.output.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
        engine = _engine(probe.SerializeToString(), feeds, _static_inputs(self.model))

        def observations():
            for feed, result in zip(feeds, _run_all(engine, feeds, computed)):
                yield {t: feed[t] if t in feed else result[t] for t in observed}

        amax = dict.fromkeys(observed, 0.0)
        for n, result in enumerate(observations()):
            for t in observed:
                a = np.abs(np.asarray(result[t], dtype=np.float32))
                if a.size and not np.all(np.isfinite(a)):
                    raise InvalidArgumentError(f"calibration feed {n} makes activation '{t}' NaN or Inf")
                if a.size:
                    amax[t] = max(amax[t], float(a.max()))
        if self.method != "minmax":
            hists = {t: np.zeros(_HIST_BINS, np.int64) for t in observed}
            for result in observations():
                for t in observed:
                    if amax[t] > 0:
                        h, _ = np.histogram(np.abs(result[t]), bins=_HIST_BINS, range=(0.0, amax[t]))
                        hists[t] += h
            for t in observed:
                width = amax[t] / _HIST_BINS
                if self.method == "percentile":
                    amax[t] = _percentile_amax(hists[t], width, self.percentile)
                else:
                    amax[t] = min(_entropy_amax(hists[t], width, 128), amax[t])
        return Calibration(_model_hash(self.model_bytes), self.method, len(feeds), amax, self.percentile)


def _opset(model) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 0


def _quantized_weight(w: np.ndarray, axis: int | None, precision: str):
    """(stored weight, scales): symmetric per-channel along axis (per-tensor for None)."""
    top = _PRECISIONS[precision]
    reduce_axes = tuple(i for i in range(w.ndim) if i != axis) if axis is not None else None
    amax = np.max(np.abs(w), axis=reduce_axes, keepdims=True) if w.size else np.zeros(1, np.float32)
    scale = np.where(amax > 0, amax / top, 1.0).astype(np.float32)
    x = w / scale
    if precision == "int8":
        q = np.clip(np.rint(x), -127, 127).astype(np.int8)
    else:
        import ml_dtypes

        q = np.clip(x, -top, top).astype(ml_dtypes.float8_e4m3fn)
    return q, scale.reshape(-1) if axis is not None else scale.reshape(())


def _weight_axis(op: str, node, w: np.ndarray) -> int | None:
    """The output-channel axis of a weight, or None where per-tensor scales are used."""
    if op == "Conv":
        return 0 if w.ndim >= 2 else None
    if op == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return (0 if trans_b else 1) if w.ndim == 2 else None
    return 1 if w.ndim == 2 else None  # MatMul B [K, N]: one scale per output column


def quantize(model: Any, calibration: Calibration, precision: str = "int8", exclude: Iterable[str] = (),
             check_hash: bool = True):
    """The model with Q/DQ nodes (an onnx.ModelProto): int8 or fp8 (float8 e4m3fn).

    Nodes named in ``exclude`` (their ONNX names, or '<op>_<index>' for nameless ones) stay float.
    """
    onnx = _onnx()
    from onnx import helper, numpy_helper

    if precision not in _PRECISIONS:
        raise InvalidArgumentError(f"precision '{precision}' is not one of {', '.join(_PRECISIONS)}")
    proto, data = _load(model)
    if check_hash:
        calibration.check_model(data)
    # Nameless nodes take the names reports and exclusions use, before a version conversion can
    # move them.
    for node, name in zip(proto.graph.node, _node_names(proto.graph)):
        node.name = name
    known = set(_node_names(proto.graph))
    exclude = set(exclude)
    unknown = sorted(exclude - known)
    if unknown:
        raise InvalidArgumentError(f"excluded node(s) {', '.join(unknown)} are not in the model")
    need = 19 if precision == "fp8" else 13  # float8 Q/DQ: opset 19; per-channel axis: opset 13
    if _opset(proto) < need:
        proto = onnx.version_converter.convert_version(proto, need)
    g = proto.graph
    sites = _sites(g)
    top = _PRECISIONS[precision]
    constants = _constants(g)
    initializers = {t.name: t for t in g.initializer}
    new_nodes: dict[int, list] = {}  # node index -> nodes to insert before it
    dq_of: dict[str, str] = {}  # activation -> its dequantized name
    used_names = {o for n in g.node for o in n.output} | {t.name for t in g.initializer} | {i.name for i in g.input}

    def fresh(base: str) -> str:
        name, k = base, 0
        while name in used_names:
            k += 1
            name = f"{base}_{k}"
        used_names.add(name)
        return name

    def zero_point(shape: tuple[int, ...]) -> Any:
        if precision == "int8":
            return numpy_helper.from_array(np.zeros(shape, np.int8))
        import ml_dtypes

        return numpy_helper.from_array(np.zeros(shape, ml_dtypes.float8_e4m3fn))

    for site in sites:
        if site.name in exclude:
            continue
        node = g.node[site.node]
        inserted = new_nodes.setdefault(site.node, [])
        for k in site.activations:
            t = node.input[k]
            if t not in calibration.amax:
                raise InvalidArgumentError(
                    f"the calibration has no range for '{t}' (input {k} of {site.op} node '{site.name}'); calibrate "
                    "this model again")
            if t not in dq_of:
                amax = calibration.amax[t]
                scale_name, zp_name = fresh(f"{t}_scale"), fresh(f"{t}_zero_point")
                g.initializer.append(numpy_helper.from_array(np.array(amax / top if amax > 0 else 1.0, np.float32),
                                                             scale_name))
                zp = zero_point(())
                zp.name = zp_name
                g.initializer.append(zp)
                q, dq = fresh(f"{t}_quantized"), fresh(f"{t}_dequantized")
                inserted.append(helper.make_node("QuantizeLinear", [t, scale_name, zp_name], [q], name=fresh(f"{q}_node")))
                inserted.append(helper.make_node("DequantizeLinear", [q, scale_name, zp_name], [dq],
                                                 name=fresh(f"{dq}_node")))
                dq_of[t] = dq
            node.input[k] = dq_of[t]
        if site.weight is not None:
            w_name = node.input[site.weight]
            w = constants[w_name]
            axis = _weight_axis(site.op, node, w)
            q, scale = _quantized_weight(w, axis, precision)
            qw_name, scale_name, zp_name = fresh(f"{w_name}_quantized"), fresh(f"{w_name}_scale"), fresh(
                f"{w_name}_zero_point")
            g.initializer.append(numpy_helper.from_array(q, qw_name))
            g.initializer.append(numpy_helper.from_array(scale, scale_name))
            zp = zero_point(scale.shape)
            zp.name = zp_name
            g.initializer.append(zp)
            attrs = {"axis": axis} if axis is not None else {}
            dq = fresh(f"{w_name}_dequantized")
            inserted.append(helper.make_node("DequantizeLinear", [qw_name, scale_name, zp_name], [dq],
                                             name=fresh(f"{dq}_node"), **attrs))
            node.input[site.weight] = dq
    # A Q/DQ pair goes in front of the first node that reads it, so the node order stays topological.
    ordered = []
    for i, node in enumerate(g.node):
        ordered.extend(new_nodes.get(i, []))
        ordered.append(node)
    del g.node[:]
    g.node.extend(ordered)
    # Float weights no node reads any more are dropped (the quantized copies replace them).
    read = {x for n in g.node for x in n.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in read or t.name not in initializers]
    del g.initializer[:]
    g.initializer.extend(keep)
    meta = {p.key: p for p in proto.metadata_props}
    entry = meta.get("kiln.quantization") or proto.metadata_props.add()
    entry.key = "kiln.quantization"
    entry.value = json.dumps({"precision": precision, "method": calibration.method,
                              "float_nodes": sorted(exclude), "samples": calibration.samples})
    onnx.checker.check_model(proto)
    return proto


_METRICS = ("cosine", "top1", "maxabs")


def parse_budget(text: str) -> tuple[str, float]:
    """'cosine:0.999', 'top1:0.99' or 'maxabs:0.05' as (metric, bound)."""
    metric, _, value = text.partition(":")
    if metric not in _METRICS or not value:
        raise InvalidArgumentError(f"accuracy budget '{text}' is not METRIC:VALUE with METRIC one of {', '.join(_METRICS)}")
    try:
        bound = float(value)
    except ValueError:
        raise InvalidArgumentError(f"accuracy budget '{text}': '{value}' is not a number") from None
    if not math.isfinite(bound) or (metric != "maxabs" and not 0.0 <= bound <= 1.0) or bound < 0:
        raise InvalidArgumentError(f"accuracy budget '{text}': {metric} takes a value in "
                                   f"{'[0, 1]' if metric != 'maxabs' else '[0, inf)'}")
    return metric, bound


def _measure(metric: str, got: list[dict[str, np.ndarray]], ref: list[dict[str, np.ndarray]]) -> float:
    if metric == "top1":
        name = next(iter(ref[0]))
        a = np.concatenate([r[name].reshape(r[name].shape[0], -1).argmax(-1) for r in ref])
        b = np.concatenate([r[name].reshape(r[name].shape[0], -1).argmax(-1) for r in got])
        return float(np.mean(a == b))
    x = np.concatenate([np.asarray(r[k], np.float64).ravel() for r in got for k in sorted(r)])
    y = np.concatenate([np.asarray(r[k], np.float64).ravel() for r in ref for k in sorted(r)])
    if metric == "maxabs":
        return float(np.max(np.abs(x - y))) if x.size else 0.0
    denom = np.linalg.norm(x) * np.linalg.norm(y)
    return float(x @ y / denom) if denom > 0 else float(np.array_equal(x, y))


def check_budget(metric: str, bound: float, value: float) -> bool:
    return value <= bound if metric == "maxabs" else value >= bound


def quantize_to_budget(model: Any, calibration: Calibration, holdout: Iterable[Mapping[str, Any]], budget: str,
                       precision: str = "int8") -> tuple[Any, dict[str, Any]]:
    """The quantized model meeting ``budget`` against the FP32 engine on ``holdout``, and a report.

    Each quantizable node's sensitivity is the metric with only it quantized; the most sensitive
    are left in float one at a time until the whole model meets the budget. On the CPU the float
    layers run FP32; on a GPU the same model built with --fp16 runs them in FP16.
    """
    metric, bound = parse_budget(budget)
    proto, data = _load(model)
    calibration.check_model(data)
    feeds = _feed_list(holdout, _graph_inputs(proto), "held-out feed")
    outputs = [o.name for o in proto.graph.output]
    static = _static_inputs(proto)  # Q/DQ insertion leaves the graph inputs as they are
    ref = list(_run_all(_engine(data, feeds, static), feeds, outputs))
    names = [s.name for s in _sites(proto.graph)]

    def score(exclude: Iterable[str]) -> float:
        q = quantize(proto, calibration, precision, exclude, check_hash=False)
        return _measure(metric, list(_run_all(_engine(q.SerializeToString(), feeds, static), feeds, outputs)), ref)

    everything = score(())
    report: dict[str, Any] = {"metric": metric, "budget": bound, "precision": precision, "all_quantized": everything,
                              "layers": len(names), "moved_to_float": [], "sensitivity": {}}
    if check_budget(metric, bound, everything):
        report["final"] = everything
        return quantize(proto, calibration, precision, check_hash=False), report
    sensitivity = {n: score([m for m in names if m != n]) for n in names}
    report["sensitivity"] = sensitivity
    worst_first = sorted(names, key=lambda n: sensitivity[n], reverse=(metric == "maxabs"))
    moved: list[str] = []
    value = everything
    for n in worst_first:
        moved.append(n)
        value = score(moved)
        if check_budget(metric, bound, value):
            break
    if not check_budget(metric, bound, value):
        raise InvalidArgumentError(
            f"accuracy budget {budget} cannot be met: with every one of the {len(names)} layers in float the "
            f"{metric} is {value:.6g}")
    report["moved_to_float"], report["final"] = moved, value
    return quantize(proto, calibration, precision, moved, check_hash=False), report


def _read_feeds(path: str, inputs: Sequence[str], batch: int) -> list[dict[str, np.ndarray]]:
    """Feeds from a folder of .npz files (one feed each, sorted by name) or one .npz whose arrays
    stack samples along axis 0 (split into batches of ``batch``)."""
    p = pathlib.Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.npz"))
        if not files:
            raise InvalidArgumentError(f"calibration folder '{p}' holds no .npz file")
        feeds = []
        for f in files:
            with np.load(f, allow_pickle=False) as z:
                feeds.append({k: z[k] for k in z.files})
        return feeds
    if not p.is_file():
        raise InvalidArgumentError(f"calibration data '{p}' is neither a folder of .npz files nor an .npz file")
    with np.load(p, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    lengths = {k: a.shape[0] if a.ndim else 0 for k, a in arrays.items()}
    if len(set(lengths.values())) != 1 or not next(iter(lengths.values()), 0):
        raise InvalidArgumentError(f"calibration data '{p}': every array stacks the same number (> 0) of samples "
                                   f"along axis 0, not {lengths}")
    n = next(iter(lengths.values()))
    return [{k: a[i:i + batch] for k, a in arrays.items()} for i in range(0, n, batch)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kiln quantize",
        description="Calibrate an ONNX model on kiln's CPU engine and write it with explicit Q/DQ nodes.")
    parser.add_argument("--onnx", required=True, help="the FP32 ONNX model")
    parser.add_argument("--calib", help="calibration data: a folder of .npz feeds, or one .npz stacking samples")
    parser.add_argument("--calibBatch", type=int, default=8, help="samples per feed when --calib is one .npz (8)")
    parser.add_argument("--calibMethod", default="entropy", choices=_METHODS)
    parser.add_argument("--percentile", type=float, default=99.99, help="for --calibMethod=percentile (99.99)")
    parser.add_argument("--calibCache", help="read the calibration from this JSON if it exists, else write it there")
    parser.add_argument("--fp8", action="store_true", help="float8 e4m3fn instead of int8")
    parser.add_argument("--exclude", default="", help="comma-separated node names to leave in float")
    parser.add_argument("--accuracyBudget", help="METRIC:VALUE (cosine, top1, maxabs) against FP32 on --holdout")
    parser.add_argument("--holdout", help="held-out data for --accuracyBudget, in --calib's forms")
    parser.add_argument("--output", required=True, help="where the Q/DQ model goes")
    args = parser.parse_args(argv)
    try:
        if args.calibBatch < 1:
            raise InvalidArgumentError(f"--calibBatch={args.calibBatch} must be at least 1")
        proto, data = _load(args.onnx)
        inputs = _graph_inputs(proto)
        cache = pathlib.Path(args.calibCache) if args.calibCache else None
        if cache is not None and cache.exists():
            calib = Calibration.load(cache)
            calib.check_model(data, f"'{args.onnx}'")
            print(f"kiln quantize: calibration read from {cache} ({calib.method}, {calib.samples} feeds)")
        else:
            if not args.calib:
                raise InvalidArgumentError("--calib is needed (or a --calibCache that exists)")
            feeds = _read_feeds(args.calib, inputs, args.calibBatch)
            calib = Calibrator(proto, args.calibMethod, args.percentile).calibrate(feeds)
            print(f"kiln quantize: calibrated {len(calib.amax)} activations on {len(feeds)} feeds ({calib.method})")
            if cache is not None:
                calib.save(cache)
                print(f"kiln quantize: calibration cache written to {cache}")
        precision = "fp8" if args.fp8 else "int8"
        exclude = [x for x in args.exclude.split(",") if x]
        if args.accuracyBudget:
            if not args.holdout:
                raise InvalidArgumentError("--accuracyBudget needs --holdout data")
            if exclude:
                raise InvalidArgumentError("--accuracyBudget chooses the float layers itself; drop --exclude")
            out, report = quantize_to_budget(proto, calib, _read_feeds(args.holdout, inputs, args.calibBatch),
                                             args.accuracyBudget, precision)
            print(f"kiln quantize: {report['metric']} {report['all_quantized']:.6g} with every layer quantized, "
                  f"{report['final']:.6g} with {len(report['moved_to_float'])} in float "
                  f"({', '.join(report['moved_to_float']) or 'none'}); budget {report['budget']}")
        else:
            out = quantize(proto, calib, precision, exclude)
        _onnx().save(out, args.output)
        q = sum(1 for n in out.graph.node if n.op_type == "QuantizeLinear")
        print(f"kiln quantize: wrote {args.output} ({precision}, {q} activations quantized)")
        return 0
    except InvalidArgumentError as e:
        print(f"kiln quantize: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
