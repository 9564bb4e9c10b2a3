"""The torch_dynamo_backends entry point of the installed package: torch.compile(model,
backend="kiln") finds it without an import. It imports kiln.torch only when TorchDynamo hands it
a graph (kiln.torch registers "kiln" itself when imported; see _register_with_dynamo there)."""
from typing import Any, Dict, Optional, Sequence


def backend(gm: Any, example_inputs: Sequence[Any], options: Optional[Dict[str, Any]] = None,
            mode: Optional[str] = None) -> Any:
    """kiln.torch.backend (the same options)."""
    from . import torch as kiln_torch  # noqa: PLC0415

    return kiln_torch.backend(gm, example_inputs, options=options, mode=mode)
