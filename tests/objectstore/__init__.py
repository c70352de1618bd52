"""A real S3 server for the tests: versitygw (Versity's S3 gateway) serving a temporary directory.

Checkpoints and data on S3 are tested against a real S3 implementation (SigV4 signatures, multipart
uploads, ListObjectsV2, CopyObject), built from its Go module by tests/controlplane/build.sh like the
control plane; nothing here is an in-process mock. ``server`` finds (or builds) the binary and runs it;
``fixtures`` offers it to pytest, on loopback for the trainer tier and on the cluster bed's address for
the e2e tier (pods reach it there).
"""
