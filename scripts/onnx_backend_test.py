#!/usr/bin/env python3
"""Runs onnx's own BackendTest with kiln.backend over the ONNX node tests and prints
"N passed, M failed, K skipped", the line kiln_node_tests prints for the same corpus.

By default the node tests are read from the corpus scripts/fetch_onnx_tests.sh generates (the one
kiln_node_tests runs), so both runners see the same models and the same data; --in-memory uses
the cases onnx builds in memory instead (BackendTest's default; unseeded random inputs).
Tests in tests/conformance/exclusions.txt are skipped, as the runner counts them. Only the CPU
variants run (kiln.backend.supports_device("CPU")); tolerances are BackendTest's own (rtol 1e-3,
atol 1e-7, two ulps for bfloat16), the same as the runner's.

ONNX node tests feed the inputs that set shapes (axes, pads, sizes, K) as graph inputs. kiln.backend
gives such an input to the engine as a shape-value input, built for the values run() gives and
checked at run time (kiln_node_tests ranges them over the test's data sets). A value the builder
needs that is computed from graph inputs (a Cast of one, say) is beyond that: this script's
wrapper (binding_backend below) then binds the graph inputs feeding it to the test's values at
build time, unless --no-bind is given, which shows plain kiln.backend (measured 2026-11-27 over
onnx 1.23.1's corpus: 1566 passed plain, 1606 with the wrapper; 1323 plain before kiln.backend
took shape values).

Usage: scripts/onnx_backend_test.py [--corpus DIR] [--filter SUBSTR] [--verbose] [--in-memory]
                                    [--no-bind] [--manifest FILE] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import unittest
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_manifest(path: str) -> list[tuple[str, str]]:
    """(pattern, reason) pairs; a pattern is a test name or a prefix ending in '*'."""
    entries = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            head, _, reason = line.partition("#")
            head, reason = head.strip(), reason.strip()
            if not head:
                continue
            if not reason:
                raise SystemExit(f"{path}:{n}: '{head}' has no reason")
            entries.append((head, reason))
    return entries


def manifest_regex(pattern: str) -> str:
    """The BackendTest exclude pattern of a manifest entry (its tests are named <test>_cpu)."""
    if pattern.endswith("*"):
        return "^" + re.escape(pattern[:-1]) + ".*_cpu$"
    return "^" + re.escape(pattern) + "_cpu$"


def binding_backend(kiln_backend):
    """kiln.backend with kiln_node_tests' binding policy (tests/conformance/node_test_runner.cc).

    An input whose values kiln needs at build time (axes, pads, sizes, K: ONNX node tests feed them
    as graph inputs) is bound to the value the first run() gives, as TensorRT's shape-value
    profiles do; when the value the builder names is computed from graph inputs, the graph inputs
    feeding it are bound (the walk stops at Shape and Size, which read only an input's shape).
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnx.backend.base import BackendRep

    import kiln

    def needs_binding(err: Exception) -> bool:
        msg = str(err)
        return "at run time" in msg or "must be a scalar constant" in msg

    def inputs_to_bind(model: onnx.ModelProto, msg: str) -> list:
        inits = {t.name for t in model.graph.initializer}
        graph_inputs = [i.name for i in model.graph.input if i.name not in inits]
        named = [n for n in graph_inputs if f"'{n}'" in msg]
        if named:
            return named[:1]
        producer = {o: node for node in model.graph.node for o in node.output if o}
        stack = [n for n in producer if f"'{n}'" in msg]
        seen = set()
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            node = producer.get(v)
            reads_shape = node is not None and node.domain in ("", "ai.onnx") and \
                node.op_type in ("Shape", "Size")
            if node is None or reads_shape:
                continue
            stack.extend(i for i in node.input if i)
        wanted = [n for n in graph_inputs if n in seen]
        return wanted[:1]

    class BindingRep(BackendRep):
        def __init__(self, model, device, kwargs):
            inits = {t.name for t in model.graph.initializer}
            self.input_names = [i.name for i in model.graph.input if i.name not in inits]
            self.model, self.device, self.kwargs = model, device, kwargs
            self.bound = {}
            self.rep = None
            try:  # builds now when the shapes are static, as kiln.backend does
                self.rep = kiln_backend.prepare(model, device, **kwargs)
            except kiln.Error as e:
                if not needs_binding(e):
                    raise

        def run(self, inputs, **kwargs):
            feed = dict(inputs) if isinstance(inputs, dict) else dict(zip(self.input_names, inputs))
            for name, value in self.bound.items():
                if not np.array_equal(np.asarray(feed[name]), value):
                    raise kiln.UnsupportedError(f"input '{name}' was bound to other values")
            for _ in range(len(self.input_names) + 1):
                try:
                    if self.rep is None:
                        self.rep = kiln_backend.prepare(self.model, self.device, **self.kwargs)
                    return self.rep.run({n: feed[n] for n in self.rep.input_names})
                except kiln.Error as e:
                    if not needs_binding(e):
                        raise
                    bind = inputs_to_bind(self.model, str(e))
                    if not bind:
                        raise
                model = onnx.ModelProto()
                model.CopyFrom(self.model)
                for name in bind:
                    value = np.asarray(feed[name])
                    model.graph.initializer.append(numpy_helper.from_array(value, name))
                    self.bound[name] = value
                self.model, self.rep = model, None
            raise kiln.UnsupportedError("binding inputs did not make the model buildable")

    class KilnBindingBackend(kiln_backend):
        @classmethod
        def prepare(cls, model, device="CPU", **kwargs):
            if not isinstance(model, onnx.ModelProto):
                loaded = isinstance(model, bytes)
                model = onnx.load_from_string(model) if loaded else onnx.load(model)
            return BindingRep(model, device, kwargs)

    return KilnBindingBackend


def node_tests_on_disk(node_dir: str):
    """The node tests of a generated corpus, as onnx's loader describes on-disk model tests."""
    from onnx.backend.test.case.test_case import TestCase

    cases = []
    for name in sorted(os.listdir(node_dir)):
        case_dir = os.path.join(node_dir, name)
        if not os.path.exists(os.path.join(case_dir, "model.onnx")):
            continue
        # rtol/atol: onnx's loader defaults for node tests (1e-3, 1e-7), as kiln_node_tests uses.
        cases.append(TestCase(name=name, model_name=name, url=None, model_dir=case_dir,
                              model=None, data_sets=None, kind="node", rtol=1e-3, atol=1e-7))
    return cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=os.path.join(ROOT, "build", "onnx-tests"),
                    help="the corpus folder of scripts/fetch_onnx_tests.sh (made if missing)")
    ap.add_argument("--manifest",
                    default=os.path.join(ROOT, "tests", "conformance", "exclusions.txt"))
    ap.add_argument("--filter", default="", help="run only tests whose name contains this")
    ap.add_argument("--in-memory", action="store_true",
                    help="onnx's in-memory node cases instead of the corpus on disk")
    ap.add_argument("--no-bind", action="store_true",
                    help="plain kiln.backend, without kiln_node_tests' build-time binding of "
                         "inputs kiln needs as constants (axes, pads, sizes, K)")
    ap.add_argument("--verbose", action="store_true", help="print each failure's reason")
    ap.add_argument("--json", default="", help="write every test's result to this file")
    args = ap.parse_args()

    import onnx.backend.test
    import onnx.backend.test.runner as runner_mod

    import kiln.backend

    if not args.in_memory:
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "fetch_onnx_tests.sh"), args.corpus],
                       check=True, stdout=sys.stderr)
        node_dir = os.path.join(args.corpus, "data", "node")
        original = runner_mod.load_model_tests

        def load_model_tests(data_dir=None, kind=None):
            if kind == "node":
                return node_tests_on_disk(node_dir)
            return []  # the node tests only, as kiln_node_tests' headline counts

        runner_mod.load_model_tests = load_model_tests
    else:
        original = runner_mod.load_model_tests

        def load_model_tests(data_dir=None, kind=None):
            if kind == "node":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return original(kind="node")
            return []

        runner_mod.load_model_tests = load_model_tests

    backend = kiln.backend.KilnBackend
    if not args.no_bind:
        backend = binding_backend(backend)
    backend_test = onnx.backend.test.BackendTest(backend, __name__)
    runner_mod.load_model_tests = original
    reasons = {}
    for pattern, reason in read_manifest(args.manifest):
        backend_test.exclude(manifest_regex(pattern))
        reasons[manifest_regex(pattern)] = reason

    suite = unittest.TestSuite()
    for case in backend_test.test_cases.values():
        for name in sorted(vars(case)):
            if not name.startswith("test_") or not name.endswith("_cpu"):
                continue  # the _cuda variants: the conformance runner drives the CPU backend
            if args.filter and args.filter not in name:
                continue
            suite.addTest(case(name))

    class Result(unittest.TestResult):
        def __init__(self):
            super().__init__()
            self.passed = []

        def addSuccess(self, test):
            super().addSuccess(test)
            self.passed.append(test)

    result = Result()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        suite.run(result)

    def short(test):
        return test.id().rsplit(".", 1)[-1][: -len("_cpu")]

    failed = [(t, e) for t, e in result.failures + result.errors]
    if args.verbose:
        for t, err in sorted(failed, key=lambda x: short(x[0])):
            last = err.strip().splitlines()[-1] if err.strip() else ""
            print(f"FAIL {short(t)}: {last[:400]}")
    if args.json:
        rows = [{"name": short(t), "result": "pass"} for t in result.passed]
        rows += [{"name": short(t), "result": "fail",
                  "reason": (e.strip().splitlines() or [""])[-1]} for t, e in failed]
        rows += [{"name": short(t), "result": "excluded", "reason": why}
                 for t, why in result.skipped]
        with open(args.json, "w") as f:
            json.dump({"tests": sorted(rows, key=lambda r: r["name"])}, f, indent=1)
    print(f"{len(result.passed)} passed, {len(failed)} failed, {len(result.skipped)} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
