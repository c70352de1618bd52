#!/usr/bin/env bash
# On the GPU machine: install the carried .whl/ into /tmp/site (no network there). Source it:
#   source bench/gpu/install_wheels.sh
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
# The GPU image has no unzip (and `python -m zipfile` drops the executable bits raylet and gcs_server need).
python3 - <<'PY'
import os, zipfile
with zipfile.ZipFile(".whl/ray-2.60.0-trimmed.zip") as z:
    for info in z.infolist():
        path = z.extract(info, "/tmp/site")
        if not info.is_dir() and info.external_attr >> 16:
            os.chmod(path, (info.external_attr >> 16) & 0o777)
PY
export PYTHONPATH=/tmp/site:$PWD/operator:$PWD/trainer_image${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
set +e
