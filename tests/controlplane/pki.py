"""Throwaway PKI for one test control plane, generated with ``cryptography`` in a few milliseconds.

Owns: one ECDSA P-256 CA (signs the apiserver's serving certificate and every client certificate, and is
the apiserver's ``--client-ca-file``), the serving certificate for 127.0.0.1/localhost and the in-cluster
``kubernetes.default.svc`` names, client certificates (the admin in group ``system:masters``, the
controller-manager as ``system:kube-controller-manager`` so it goes through real RBAC), and the
service-account token signing key pair.

One CA for serving and client auth is a simplification a production cluster would not make; for a
loopback-only cluster that lives for one test session it changes nothing a test can observe. Everything
is written with mode 0600 under the control plane's data dir and deleted with it.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Names the serving certificate is valid for. 10.0.0.1 is the first IP of the service CIDR the
#: apiserver is started with (the ``kubernetes`` Service's ClusterIP).
SERVING_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
SERVING_IPS = ("127.0.0.1", "10.0.0.1")

_VALIDITY = datetime.timedelta(days=7)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CertKeyPair:
    cert_path: Path
    key_path: Path


@dataclasses.dataclass(frozen=True, kw_only=True)
class ControlPlanePKI:
    """Paths of every file the control plane's processes and clients read."""

    ca_cert_path: Path
    ca_key_path: Path
    serving: CertKeyPair
    admin: CertKeyPair
    controller_manager: CertKeyPair
    #: The apiserver's client certificate towards kubelets (``--kubelet-client-certificate``): logs, exec.
    kubelet_client: CertKeyPair
    service_account_public_key_path: Path
    service_account_private_key_path: Path


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    return x509.Name(attributes)


def _issue(
    *,
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    ca_cert: x509.Certificate | None,
    ca_key: ec.EllipticCurvePrivateKey,
    is_ca: bool = False,
    usages: tuple[x509.ObjectIdentifier, ...] = (),
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer = ca_cert.subject if ca_cert is not None else subject
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate small clock skew
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=is_ca,
                crl_sign=is_ca,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )
    if ca_cert is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    if dns_names or ips:
        alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
        alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _issue_pair(
    directory: Path,
    stem: str,
    *,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    subject: x509.Name,
    usages: tuple[x509.ObjectIdentifier, ...],
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> CertKeyPair:
    key = _new_key()
    cert = _issue(
        subject=subject,
        public_key=key.public_key(),
        ca_cert=ca_cert,
        ca_key=ca_key,
        usages=usages,
        dns_names=dns_names,
        ips=ips,
    )
    pair = CertKeyPair(cert_path=directory / f"{stem}.crt", key_path=directory / f"{stem}.key")
    _write(pair.cert_path, _cert_pem(cert))
    _write(pair.key_path, _key_pem(key))
    return pair


def generate(
    directory: Path, *, admin_user: str = "trainop-admin", extra_serving_ips: tuple[str, ...] = ()
) -> ControlPlanePKI:
    """Create a fresh CA and every certificate/key the control plane needs under ``directory``.

    ``extra_serving_ips``: more addresses the apiserver's serving certificate is valid for (a bind
    address other than loopback).
    """
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_key = _new_key()
    ca_cert = _issue(
        subject=_name("trainop-test-ca"),
        public_key=ca_key.public_key(),
        ca_cert=None,
        ca_key=ca_key,
        is_ca=True,
    )
    ca_cert_path, ca_key_path = directory / "ca.crt", directory / "ca.key"
    _write(ca_cert_path, _cert_pem(ca_cert))
    _write(ca_key_path, _key_pem(ca_key))

    serving = _issue_pair(
        directory,
        "apiserver",
        ca_cert=ca_cert,
        ca_key=ca_key,
        subject=_name("kube-apiserver"),
        usages=(ExtendedKeyUsageOID.SERVER_AUTH,),
        dns_names=SERVING_DNS_NAMES,
        ips=SERVING_IPS + tuple(ip for ip in extra_serving_ips if ip not in SERVING_IPS),
    )
    admin = _issue_pair(
        directory,
        "admin",
        ca_cert=ca_cert,
        ca_key=ca_key,
        subject=_name(admin_user, ("system:masters",)),
        usages=(ExtendedKeyUsageOID.CLIENT_AUTH,),
    )
    controller_manager = _issue_pair(
        directory,
        "controller-manager",
        ca_cert=ca_cert,
        ca_key=ca_key,
        subject=_name("system:kube-controller-manager"),
        usages=(ExtendedKeyUsageOID.CLIENT_AUTH,),
    )
    kubelet_client = _issue_pair(
        directory,
        "apiserver-kubelet-client",
        ca_cert=ca_cert,
        ca_key=ca_key,
        subject=_name("kube-apiserver-kubelet-client"),
        usages=(ExtendedKeyUsageOID.CLIENT_AUTH,),
    )

    sa_key = _new_key()
    sa_private, sa_public = directory / "service-account.key", directory / "service-account.pub"
    _write(sa_private, _key_pem(sa_key))
    _write(
        sa_public,
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return ControlPlanePKI(
        ca_cert_path=ca_cert_path,
        ca_key_path=ca_key_path,
        serving=serving,
        admin=admin,
        controller_manager=controller_manager,
        kubelet_client=kubelet_client,
        service_account_public_key_path=sa_public,
        service_account_private_key_path=sa_private,
    )


def _load_ca(tls: ControlPlanePKI) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert = x509.load_pem_x509_certificate(tls.ca_cert_path.read_bytes())
    ca_key = serialization.load_pem_private_key(tls.ca_key_path.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{tls.ca_key_path} is not an EC key")
    return ca_cert, ca_key


def issue_client_cert(
    tls: ControlPlanePKI, directory: Path, *, stem: str, common_name: str, organizations: tuple[str, ...] = ()
) -> CertKeyPair:
    """A client certificate from the cluster CA, e.g. a node's (``system:node:<name>``, ``system:nodes``)."""
    ca_cert, ca_key = _load_ca(tls)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return _issue_pair(
        directory,
        stem,
        ca_cert=ca_cert,
        ca_key=ca_key,
        subject=_name(common_name, organizations),
        usages=(ExtendedKeyUsageOID.CLIENT_AUTH,),
    )


def issue_serving_cert(
    tls: ControlPlanePKI,
    directory: Path,
    *,
    stem: str,
    common_name: str,
    ips: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
) -> CertKeyPair:
    """A serving certificate from the cluster CA, e.g. a kubelet endpoint's (what the apiserver verifies
    with ``--kubelet-certificate-authority``)."""
    ca_cert, ca_key = _load_ca(tls)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return _issue_pair(
        directory,
        stem,
        ca_cert=ca_cert,
        ca_key=ca_key,
        subject=_name(common_name),
        usages=(ExtendedKeyUsageOID.SERVER_AUTH,),
        dns_names=dns_names,
        ips=ips,
    )
