#!/usr/bin/env python3
"""Compares two kiln_node_tests --json runs of the same corpus (the CPU backend and CUDA): prints
both headline counts and every node test that passes on the first and not on the second, with the
second run's reason. Exits 1 when such a test is not excluded (exclusions_cuda.txt) in the second
run, so the CUDA exclusion list is the whole difference.
Usage: compare_node_runs.py CPU.json CUDA.json"""
import gzip
import json
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return {(t["set"], t["name"]): t for t in json.load(f)["tests"]}


def headline(run):
    node = [t for (s, _), t in run.items() if s == "node"]
    count = lambda r: sum(t["result"] == r for t in node)
    return f"{count('pass')} passed, {count('fail')} failed, {count('excluded')} skipped"


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    cpu, cuda = load(sys.argv[1]), load(sys.argv[2])
    print(f"cpu:  {headline(cpu)}")
    print(f"cuda: {headline(cuda)}")
    unexplained = 0
    for key, t in sorted(cpu.items()):
        other = cuda.get(key)
        if key[0] != "node" or t["result"] != "pass" or (other and other["result"] == "pass"):
            continue
        result = other["result"] if other else "missing"
        reason = (other or {}).get("reason", "").replace("\n", " ")[:240]
        unexplained += result != "excluded"
        print(f"{'excluded' if result == 'excluded' else 'UNEXPLAINED'} {key[1]}: {reason}")
    for key, t in sorted(cuda.items()):
        if key[0] == "node" and t["result"] == "pass" and cpu.get(key, {}).get("result") != "pass":
            print(f"passes on cuda only: {key[1]}")
    print(f"{unexplained} test(s) pass on the cpu, fail on cuda and are not in the exclusion list")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
