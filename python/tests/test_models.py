# The six shared models through the Python API at their test shapes, against ONNX Runtime's outputs.
import numpy as np
import pytest

import kiln
from conftest import PROFILES, assert_close, built_engine, load_test_sets, require_models


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_model_matches_onnxruntime(name, tmp_path):
    require_models()
    built = built_engine(name)
    path = tmp_path / f"{name}.kiln"
    built.save(path)
    engine = kiln.Engine.load(path)  # run what was saved, so the file format is covered too
    names = [engine.io_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.tensor_mode(n) == kiln.TensorIOMode.INPUT]
    outputs = [n for n in names if engine.tensor_mode(n) == kiln.TensorIOMode.OUTPUT]
    assert inputs == list(PROFILES[name])
    context = engine.create_execution_context()
    sets = load_test_sets(name)
    assert sets, f"{name} has no test_data_set_*"
    for k, (set_inputs, set_outputs) in enumerate(sets):
        got = context.run(dict(zip(inputs, set_inputs)))
        assert sorted(got) == sorted(outputs)
        assert len(set_outputs) == len(outputs)
        for out_name, expected in zip(outputs, set_outputs):
            assert_close(got[out_name], expected, f"{name} set {k} output {out_name}")


def test_outputs_own_kiln_memory_and_survive_later_runs():
    require_models()
    engine = built_engine("testmod_linear")
    context = engine.create_execution_context()
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal((2, 3, 16), dtype=np.float32)
    x2 = rng.standard_normal((7, 5, 16), dtype=np.float32)
    y1 = context.run({"x": x1})["cat"]
    kept = y1.copy()
    y2 = context.run({"x": x2})["cat"]
    del context
    assert y1.shape == (2, 4, 8) and y2.shape == (7, 6, 8)
    assert not y1.flags.owndata  # a view of kiln's tensor, not a copy numpy made
    assert y1.flags.writeable and y1.flags.c_contiguous
    np.testing.assert_array_equal(y1, kept)  # not overwritten by the second run
    # Non-contiguous and Fortran-ordered inputs are copied into C order and give the same result.
    wide = np.zeros((2, 3, 32), np.float32)
    wide[:, :, ::2] = x1
    np.testing.assert_array_equal(engine.create_execution_context().run({"x": wide[:, :, ::2]})["cat"], kept)
    fortran = np.asfortranarray(x1)
    np.testing.assert_array_equal(engine.create_execution_context().run({"x": fortran})["cat"], kept)


def test_dlpack_host_object_is_accepted():
    require_models()

    class OnlyDLPack:
        """Exposes an array through DLPack alone (no buffer protocol), as torch or jax would."""

        def __init__(self, array):
            self._array = array

        def __dlpack__(self, *args, **kwargs):
            return self._array.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return self._array.__dlpack_device__()

    x = np.random.default_rng(1).standard_normal((3, 4, 16), dtype=np.float32)
    engine = built_engine("testmod_linear")
    expected = engine.create_execution_context().run({"x": x})["cat"]
    got = engine.create_execution_context().run({"x": OnlyDLPack(x)})["cat"]
    np.testing.assert_array_equal(got, expected)


def test_cpu_threads_per_context_give_bitwise_equal_outputs():
    """context.cpu_threads (ONNX Runtime's intra-op threads): read back, range-checked, and the
    GEMM split over threads gives the one-thread result bit for bit (vit_tiny's GEMMs are split
    into panels)."""
    require_models()
    engine = built_engine("vit_tiny")
    x = np.random.default_rng(3).standard_normal((2, 3, 224, 224), dtype=np.float32)
    context = engine.create_execution_context()
    assert context.cpu_threads >= 1
    results = {}
    for threads in (1, 3):
        context.cpu_threads = threads
        assert context.cpu_threads == threads
        results[threads] = context.run({"x": x})
    for name in results[1]:
        np.testing.assert_array_equal(results[1][name], results[3][name])
    for bad in (-1, 257):
        with pytest.raises(kiln.InvalidArgumentError, match=f"cpu threads {bad} is outside 0..256"):
            context.cpu_threads = bad
    context.cpu_threads = 0
    assert context.cpu_threads >= 1
