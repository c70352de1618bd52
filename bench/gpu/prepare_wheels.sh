#!/usr/bin/env bash
# Build .whl/ (git-ignored): what the GPU machine lacks, small enough to carry in one device call.
#
# The GPU machine has Python 3.12 with torch, pyarrow, pandas, aiohttp, grpcio, msgpack, protobuf,
# prometheus-client, nvidia-ml-py, pyyaml and requests, but no Ray and no pydantic. Ray's wheel (~79 MB)
# is over the 64 MiB a call may carry, so it is unpacked and re-zipped without what training never
# imports: the Java jars, RLlib, Serve, Ray LLM, the dashboard's web client and test folders (~42 MB).
# py-spy samples the trainer's threads (bench/gpu/i21_alternate.sh SPY=1): only with PY_SPY=1, since its 2.9 MB
# take a call's carry over 64 MiB once the tree is ~20 MB (2026-12-07); carry it instead of something else.
# On the GPU machine: `bench/gpu/install_wheels.sh` puts everything on PYTHONPATH under /tmp/site.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.whl
rm -rf "$out" && mkdir -p "$out"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
pyver=3.12
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  "${platforms[@]}" -d "$out" \
  ray==2.60.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection \
  jsonschema jsonschema-specifications referencing rpds-py tensorboardX typing-extensions==4.16.0
if [ "${PY_SPY:-0}" = 1 ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    "${platforms[@]}" -d "$out" py-spy==0.4.3
fi
tmp=$(mktemp -d)
(cd "$tmp" && unzip -q "$OLDPWD/$out"/ray-2.60.0-*.whl)
rm -rf "$tmp"/ray/jars "$tmp"/ray/rllib "$tmp"/ray/serve "$tmp"/ray/llm "$tmp"/ray/dashboard/client/build
find "$tmp" -name '*.pyc' -delete
find "$tmp" -type d -name tests -prune -exec rm -rf {} +
rm "$out"/ray-2.60.0-*.whl
(cd "$tmp" && zip -q -r -9 "$OLDPWD/$out/ray-2.60.0-trimmed.zip" .)
rm -rf "$tmp"
du -sh "$out"; ls -la "$out"
