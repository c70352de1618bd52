"""Example user workloads for ``spec.workload.entrypoint`` (put this directory on PYTHONPATH)."""
