"""Example Ray Train V2 functions that trainop runs unmodified (``spec.workload.rayTrain``)."""
