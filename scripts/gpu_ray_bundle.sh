#!/usr/bin/env bash
# Makes .gpu_ray/site.tar.xz (git-ignored): Ray Serve for the GPU host, which has no network, for
# scripts/gpu_perf.sh's serving part (KILN_PERF_SERVE). Run it on this machine (it needs PyPI);
# carry .gpu_ray with the device call. The host's python is 3.12 (x86_64) and already holds numpy,
# grpcio, protobuf, requests, pyyaml, msgpack, click, filelock, jinja2, psutil, prometheus-client,
# anyio, httpx, uvloop and the rest of Ray's dependencies but those pinned below; the host's
# aiohttp (3.14.3) is older than Ray 2.60 accepts, and grpcio-reflection stays at the host's grpcio
# (1.84). The bundle is ray[serve] (requirements-serve.txt's version) without the parts Serve
# never imports (RLlib, Tune, Train, Data, LLM, the Java jars, the dashboard's web UI), its
# binaries stripped of symbols: about 25 MB packed, 131 MB unpacked.
# Usage: scripts/gpu_ray_bundle.sh [OUTPUT] (default .gpu_ray/site.tar.xz).
set -euo pipefail
cd "$(dirname "$0")/.."
TARBALL=${1:-.gpu_ray/site.tar.xz}
PY=${PYTHON:-python3}
RAY=$(grep -oE 'ray\[serve\]==[0-9.]+' requirements-serve.txt | cut -d= -f3)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SITE=$WORK/site
"$PY" -m pip install -q --no-deps --target "$SITE" --python-version 3.12 --implementation cp --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  "ray==$RAY" aiohttp==3.14.5 aiohttp_cors==0.8.1 annotated-types==0.8.0 colorful==0.5.8 distlib==0.4.4 \
  fastapi==0.165.0 googleapis-common-protos==1.76.0 grpcio-reflection==1.84.0 httptools==0.9.0 jsonschema==4.26.0 \
  jsonschema-specifications==2025.9.1 mmh3==5.3.1 opencensus==0.11.4 opencensus-context==0.1.3 \
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2 \
  opentelemetry-exporter-prometheus==0.66b2 opentelemetry-semantic-conventions==0.66b2 platformdirs==4.14.8 \
  pydantic==2.14.4 pydantic-core==2.50.5 python-discovery==1.9.6 python-dotenv==1.2.4 referencing==0.37.0 \
  rpds-py==2026.9.1 smart_open==9.0.2 starlette==1.10.0 typing-inspection==0.4.5 uvicorn==0.54.0 \
  virtualenv==21.15.11 watchfiles==1.3.0 websockets==17.4
rm -rf "$SITE"/ray/{jars,rllib,tune,train,data,llm} "$SITE/bin/tune"
# The dashboard refuses to start without its web UI's folder: one page in its place.
rm -rf "$SITE/ray/dashboard/client/build"
mkdir -p "$SITE/ray/dashboard/client/build/static"
echo '<!doctype html><title>Ray</title><p>The dashboard web UI is not in this offline bundle.</p>' \
  >"$SITE/ray/dashboard/client/build/index.html"
find "$SITE" \( -name __pycache__ -o -name tests \) -type d -prune -exec rm -rf {} +
find "$SITE" -name '*.map' -delete
# Symbols are most of the binaries' size (147 MB -> 97 MB).
find "$SITE" -type f \( -name '*.so' -o -path '*/core/src/ray/*' \) -print0 |
  while IFS= read -r -d '' f; do
    if head -c4 "$f" | grep -q ELF; then strip --strip-unneeded "$f" 2>/dev/null || true; fi
  done
# pip wrote its own interpreter into the entry scripts.
for f in "$SITE"/bin/*; do sed -i '1s|^#!.*python.*$|#!/usr/bin/env python3|' "$f"; done
mkdir -p "$(dirname "$TARBALL")"
tar -C "$WORK" -cf - site | xz -9 -T2 >"$TARBALL"
ls -la "$TARBALL"
