# The wheel's `kiln` console command (kiln._cli): it runs the packaged C++ CLI, and `kiln compare`
# finds ONNX Runtime through the interpreter the package was installed into.
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln


def kiln_command():
    beside = pathlib.Path(sys.executable).parent / "kiln"
    path = str(beside) if beside.exists() else shutil.which("kiln")
    if path is None:
        pytest.skip("no `kiln` command beside this interpreter or on PATH (pip install . makes one)")
    return path


def run(*args):
    return subprocess.run([kiln_command(), *args], capture_output=True, text=True, timeout=300)


def test_help_and_version():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    assert "kiln build" in r.stdout and "compare" in r.stdout
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith(f"kiln {kiln.__version__}"), r.stdout


def test_compare_uses_onnxruntime_of_this_environment(tmp_path):
    pytest.importorskip("onnxruntime")
    w = numpy_helper.from_array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])],
        "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])], initializer=[w])
    model = tmp_path / "mm.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
                      .SerializeToString())
    r = run("compare", f"--onnx={model}", "--shapes=x:6x4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "reference: ONNX Runtime" in r.stdout, r.stdout
    assert "PASS" in r.stdout
