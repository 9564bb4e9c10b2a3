# Shared helpers for kiln's Python tests: where ../shared/models is, each model's profile, its
# ONNX Runtime reference test sets, and engines built once per session.
import functools
import os
import pathlib

import numpy as np
import pytest

import kiln

REPO = pathlib.Path(__file__).resolve().parents[2]
MODELS_DIR = pathlib.Path(os.environ.get("KILN_MODELS_DIR", REPO.parent / "shared" / "models"))

from shared_models import PROFILES  # noqa: E402  (the README profiles, shared with bench/)

# The shared tolerance for FP32 against ONNX Runtime: |a - e| <= ATOL + RTOL * |e|.
ATOL = 1e-4
RTOL = 1e-3


def require_models():
    if not (MODELS_DIR / "testmod_linear" / "model.onnx").exists():
        pytest.skip(f"{MODELS_DIR} is absent (set KILN_MODELS_DIR to run the model tests)")


def model_path(name):
    return MODELS_DIR / name / "model.onnx"


@functools.lru_cache(maxsize=None)
def built_engine(name):
    """The model's engine for its README profile; built once and shared by the tests."""
    network = kiln.onnx.parse_file(model_path(name))
    config = kiln.BuilderConfig()
    profile = kiln.OptimizationProfile()
    for input_name, (lo, opt, hi) in PROFILES[name].items():
        profile.set_dimensions(input_name, lo, opt, hi)
    config.add_profile(profile)
    return kiln.Builder(kiln.Device.CPU).build(network, config)


def load_test_sets(name):
    """[(inputs, outputs)] of the model's test_data_set_* folders, as numpy arrays."""
    from onnx import TensorProto, numpy_helper

    def read(path):
        t = TensorProto()
        t.ParseFromString(path.read_bytes())
        return numpy_helper.to_array(t)

    sets = []
    for folder in sorted((MODELS_DIR / name).glob("test_data_set_*")):
        inputs = [read(p) for p in sorted(folder.glob("input_*.pb"))]
        outputs = [read(p) for p in sorted(folder.glob("output_*.pb"))]
        sets.append((inputs, outputs))
    return sets


def assert_close(actual, expected, what):
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if actual.dtype.kind != "f":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    err = np.abs(actual.astype(np.float64) - expected)
    bound = ATOL + RTOL * np.abs(expected.astype(np.float64))
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else ()
    assert np.array_equal(np.isnan(actual), np.isnan(expected)), f"{what}: NaNs differ"
    assert np.all(err <= bound), (
        f"{what}: {int(np.sum(err > bound))} of {err.size} elements off; worst at {worst}: "
        f"{actual[worst]} vs {expected[worst]}")
    # A broken kernel writing zeros must not pass on a mostly-zero reference.
    assert np.count_nonzero(expected) == 0 or np.count_nonzero(actual) > 0, f"{what}: all zeros"
