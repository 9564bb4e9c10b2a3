"""The `kiln` console command of the wheel: runs the C++ CLI packaged at kiln/bin/kiln.

The binary is the same `kiln` the CMake build makes (tools/kiln). This entry point only tells it
which Python to use for `kiln compare`'s ONNX Runtime reference (this interpreter, so the
onnxruntime installed beside kiln is the one found) and where the packaged helper script is.
"""

import os
import sys
from pathlib import Path


def main() -> None:
    here = Path(__file__).resolve().parent
    exe = here / "bin" / "kiln"
    if not exe.is_file():
        sys.stderr.write(f"kiln: the command-line tool is missing from this installation ({exe})\n")
        raise SystemExit(1)
    env = dict(os.environ)
    env.setdefault("KILN_PYTHON", sys.executable)
    env.setdefault("KILN_ORT_REFERENCE", str(here / "tools" / "ort_reference.py"))
    os.execve(str(exe), [str(exe), *sys.argv[1:]], env)


if __name__ == "__main__":
    main()
