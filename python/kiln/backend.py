"""kiln.backend: kiln behind onnx's backend API (onnx.backend.base.Backend).

So onnx's BackendTest and other ONNX tooling can drive kiln:

    import kiln.backend
    outputs = kiln.backend.run_model(model_proto, [x])      # a namedtuple of numpy arrays
    rep = kiln.backend.prepare(model_proto, "CPU")          # reusable; rep.run([x])

prepare() builds an engine at once when every input shape is static (or when ``input_shapes``
gives them); otherwise the first run() with new input shapes builds one whose single profile is
exactly those shapes, and later runs with the same shapes reuse it.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

import kiln

__all__ = ["KilnBackend", "KilnBackendRep", "prepare", "run_model", "run_node", "supports_device"]

Shape = Tuple[int, ...]
# run_node's default opset: one kiln's frontend accepts (the installed onnx may know newer ones).
_RUN_NODE_OPSET = 17


def _kiln_device(device: str) -> "kiln.Device":
    kind = Device(device).type
    if kind == DeviceType.CPU:
        return kiln.Device.CPU
    if kind == DeviceType.CUDA:
        return kiln.Device.CUDA
    raise kiln.UnsupportedError(f"kiln has no backend for device {device!r}")


def _static_shape(value_info: onnx.ValueInfoProto) -> Optional[Shape]:
    """The input's shape when every dim is a number, else None."""
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims = []
    for d in tensor_type.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(d.dim_value)
    return tuple(dims)


def _kind(value_info: onnx.ValueInfoProto) -> str:
    """"tensor", "sequence", "optional_tensor" or "optional_sequence": what the input or output holds."""
    t = value_info.type
    prefix = ""
    if t.WhichOneof("value") == "optional_type":
        prefix, t = "optional_", t.optional_type.elem_type
    return prefix + ("sequence" if t.WhichOneof("value") == "sequence_type" else "tensor")


# What kiln's build error says of a model input whose values it needs at build time (a Tile's
# repeats, a Reshape's target fed as a graph input): the profile can give them as shape values.
_SHAPE_VALUES_HINT = "as a model input it can take shape values"


def _inputs_needing_values(message: str, input_names: Sequence[str]) -> List[str]:
    if _SHAPE_VALUES_HINT not in message:
        return []
    return [n for n in input_names if f"('{n}', the " in message]


class KilnBackendRep(BackendRep):
    """A prepared model: engines keyed by input shapes, each with one exact-shape profile.

    An input whose values decide shapes (a Tile's repeats, a Reshape's target, Resize sizes given
    as graph inputs) is a shape-value input of the engine, as TensorRT's shape tensors are: the
    engine is built for the values the run gives (OptimizationProfile.set_shape_values), which it
    then checks at run time, and other values build another engine, as other shapes do.

    Sequence and optional inputs and outputs (ONNX sequence(tensor) and optional types) are lists
    and None: an engine is built for the sequences' lengths and the optionals' presence that run()
    gives, its tensors named as kiln lays them out ("xs[0]", "xs[1]", ...; see
    BuilderConfig.set_sequence_length).
    """

    def __init__(self, network: "kiln.Network", input_names: Sequence[str],
                 output_names: Sequence[str], device: "kiln.Device",
                 input_kinds: Optional[Mapping[str, str]] = None,
                 output_kinds: Optional[Mapping[str, str]] = None):
        self.network = network
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.device = device
        self.input_kinds = dict(input_kinds or {})    # name -> _kind(); tensors may be left out
        self.output_kinds = dict(output_kinds or {})
        self.value_inputs: List[str] = []  # inputs the engines take as shape values, in order found
        self._engines: Dict[Tuple[Any, ...], Tuple[kiln.Engine, kiln.ExecutionContext]] = {}

    def engine_for(self, shapes: Mapping[str, Shape],
                   values: Optional[Mapping[str, Any]] = None,
                   structure: Optional[Mapping[str, Optional[int]]] = None) -> "kiln.Engine":
        """The engine (built now if needed) whose profile is exactly these input shapes (and, for
        inputs whose values decide shapes, these values). `shapes` is keyed by the engine's tensor
        names; `structure` gives each sequence input's length and None for an absent optional."""
        return self._context_for(shapes, values, structure)[0]

    def _key(self, shapes: Mapping[str, Shape], values: Optional[Mapping[str, Any]],
             structure: Mapping[str, Optional[int]]) -> Tuple[Any, ...]:
        key: Tuple[Any, ...] = tuple(sorted((n, tuple(s)) for n, s in shapes.items()))
        key += tuple(sorted((n, -1 if v is None else v) for n, v in structure.items()))
        if self.value_inputs and values is not None:
            key += tuple((np.asarray(values[n]).dtype.str, np.asarray(values[n]).tobytes()) for n in self.value_inputs)
        return key

    def _context_for(self, shapes: Mapping[str, Shape], values: Optional[Mapping[str, Any]] = None,
                     structure: Optional[Mapping[str, Optional[int]]] = None):
        structure = dict(structure or {})
        for _ in range(len(self.input_names) + 1):
            if self.value_inputs and values is None:
                raise kiln.UnsupportedError(
                    f"input(s) {', '.join(map(repr, self.value_inputs))} decide shapes by their values: "
                    "the engine is built when run() gives them")
            key = self._key(shapes, values, structure)
            if key in self._engines:
                return self._engines[key]
            config = kiln.BuilderConfig()
            for name, length in structure.items():
                if length is None:
                    config.set_optional_present(name, False)
                elif self.input_kinds.get(name, "tensor").endswith("sequence"):
                    config.set_sequence_length(name, length)
            profile = kiln.OptimizationProfile()
            for name, shape in shapes.items():
                shape = list(shape)
                profile.set_dimensions(name, shape, shape, shape)
                if name in self.value_inputs:
                    profile.set_shape_values(name, np.array(values[name], order="C"))  # 0-d stays 0-d
            config.add_profile(profile)
            try:
                engine = kiln.Builder(self.device).build(self.network, config)
            except kiln.Error as e:
                found = [n for n in _inputs_needing_values(str(e), self.input_names) if n not in self.value_inputs]
                if not found:
                    raise
                self.value_inputs += found
                if values is None:
                    raise  # prepare(): run() gives the values
                continue
            self._engines[key] = (engine, engine.create_execution_context())
            return self._engines[key]
        raise kiln.UnsupportedError("giving inputs as shape values did not make the model buildable")

    def run(self, inputs: Any, input_feed: Any = None, **kwargs: Any) -> Tuple[Any, ...]:
        """Runs on inputs given as a list (graph input order), a dict, or a single array.

        ONNX Runtime's run(output_names, input_feed) works too: ``rep.run(None, {"x": x})`` or
        ``rep.run(["y"], [x])`` returns the named outputs (all for None), in that order.
        """
        if input_feed is not None:
            output_names = list(inputs) if inputs else list(self.output_names)
            unknown = [n for n in output_names if n not in self.output_names]
            if unknown:
                raise kiln.NotFoundError(f"the model has no output named {', '.join(map(repr, unknown))} "
                                         f"(its outputs: {', '.join(self.output_names)})")
            by_name = dict(zip(self.output_names, self.run(input_feed)))
            return namedtupledict("Outputs", output_names)(*[by_name[n] for n in output_names])
        if isinstance(inputs, Mapping):
            named = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray) or hasattr(inputs, "__dlpack__"):
                inputs = [inputs]
            inputs = list(inputs)
            if len(inputs) != len(self.input_names):
                raise kiln.InvalidArgumentError(
                    f"the model has {len(self.input_names)} input(s) {self.input_names}, "
                    f"got {len(inputs)}")
            named = dict(zip(self.input_names, inputs))
        missing = [n for n in self.input_names if n not in named]
        if missing:
            raise kiln.InvalidArgumentError(f"missing input(s): {', '.join(missing)}")

        def array(a: Any) -> Any:
            return a if hasattr(a, "__dlpack__") else np.asarray(a)

        arrays: Dict[str, Any] = {}
        structure: Dict[str, Optional[int]] = {}  # sequence lengths; None: an absent optional
        for n in self.input_names:
            kind, value = self.input_kinds.get(n, "tensor"), named[n]
            if kind.startswith("optional") and value is None:
                structure[n] = None
            elif kind.endswith("sequence"):
                items = list(value)
                structure[n] = len(items)
                arrays.update((f"{n}[{i}]", array(a)) for i, a in enumerate(items))
            else:
                arrays[n] = array(value)
        _, context = self._context_for({n: tuple(a.shape) for n, a in arrays.items()}, arrays, structure)
        outputs = context.run(arrays)
        results = []
        for n in self.output_names:
            kind = self.output_kinds.get(n, "tensor")
            if kind.endswith("sequence"):
                items = []
                while f"{n}[{len(items)}]" in outputs:
                    items.append(outputs[f"{n}[{len(items)}]"])
                results.append(None if kind.startswith("optional") and not items else items)
            else:
                results.append(outputs.get(n) if kind.startswith("optional") else outputs[n])
        return namedtupledict("Outputs", self.output_names)(*results)


class KilnBackend(Backend):
    """onnx.backend.base.Backend implemented with kiln."""

    @classmethod
    def prepare(cls, model: Union[onnx.ModelProto, bytes, str, "os.PathLike[str]"], device: str = "CPU",
                input_shapes: Optional[Mapping[str, Sequence[int]]] = None,
                **kwargs: Any) -> KilnBackendRep:
        """Parses the model; builds now if all input shapes are known (static or input_shapes)."""
        if isinstance(model, (str, os.PathLike)):  # a model file: external data beside it works
            network = kiln.onnx.parse_file(model)
            model = onnx.load(model, load_external_data=False)
        elif isinstance(model, bytes):
            network = kiln.onnx.parse_bytes(model)
            model = onnx.load_from_string(model)
        else:
            network = kiln.onnx.parse_bytes(model.SerializeToString())
        initializers = {t.name for t in model.graph.initializer}
        graph_inputs = [i for i in model.graph.input if i.name not in initializers]
        rep = KilnBackendRep(network, [i.name for i in graph_inputs],
                             [o.name for o in model.graph.output], _kiln_device(device),
                             {i.name: _kind(i) for i in graph_inputs},
                             {o.name: _kind(o) for o in model.graph.output})
        shapes = {i.name: _static_shape(i) for i in graph_inputs}
        shapes.update({n: tuple(s) for n, s in (input_shapes or {}).items()})
        # A sequence or optional input: its length or presence is known when run() gives it.
        structured = any(k != "tensor" for k in rep.input_kinds.values())
        if not structured and all(s is not None for s in shapes.values()):
            try:
                rep.engine_for(shapes)
            except kiln.Error:
                if not rep.value_inputs:
                    raise  # else the engine is built when run() gives those inputs' values
        return rep

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> Tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Optional[Sequence[Tuple[np.dtype, Shape]]] = None,
                 **kwargs: Any) -> Tuple[Any, ...]:
        """Runs one node by wrapping it in a model whose output types onnx infers."""
        arrays = [np.asarray(a) for a in inputs]
        graph_inputs = [
            onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for name, a in zip(node.input, arrays)]
        graph_outputs = [onnx.helper.make_empty_tensor_value_info(name) for name in node.output]
        opset = kwargs.get("opset_version", _RUN_NODE_OPSET)
        model = onnx.helper.make_model(
            onnx.helper.make_graph([node], "run_node", graph_inputs, graph_outputs),
            opset_imports=[onnx.helper.make_opsetid("", opset)])
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        return cls.prepare(model, device).run(arrays)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """CPU always; CUDA when this build of kiln has the CUDA backend."""
        try:
            return kiln.device_available(_kiln_device(device))
        except kiln.Error:
            return False


prepare = KilnBackend.prepare
run_model = KilnBackend.run_model
run_node = KilnBackend.run_node
supports_device = KilnBackend.supports_device
