"""Certificates and keys of the local control plane (a CA, serving and client certs, SA key)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["PkiPaths", "write_pki"]

_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class PkiPaths:
    """Files written by :func:`write_pki`."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(
    *,
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    signer: ec.EllipticCurvePrivateKey,
    is_ca: bool,
    usages: list[x509.ObjectIdentifier],
    sans: list[x509.GeneralName],
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    return builder.sign(signer, hashes.SHA256())


def _write(path: Path, data: bytes, *, private: bool) -> None:
    path.write_bytes(data)
    path.chmod(0o600 if private else 0o644)


def write_pki(directory: Path, *, extra_ips: tuple[str, ...] = ()) -> PkiPaths:
    """Write a fresh CA, API-server serving cert, admin client cert and SA signing key."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = PkiPaths(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
    )
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rolloutpool-local-ca")])
    ca = _cert(
        subject=ca_name,
        issuer=ca_name,
        public_key=ca_key.public_key(),
        signer=ca_key,
        is_ca=True,
        usages=[],
        sans=[],
    )
    _write(paths.ca_cert, ca.public_bytes(serialization.Encoding.PEM), private=False)
    _write(paths.ca_key, _pem_key(ca_key), private=True)

    serving_key = ec.generate_private_key(ec.SECP256R1())
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    ips = ["127.0.0.1", "10.0.0.1", *extra_ips]
    serving = _cert(
        subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        issuer=ca_name,
        public_key=serving_key.public_key(),
        signer=ca_key,
        is_ca=False,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=[x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips],
    )
    _write(paths.serving_cert, serving.public_bytes(serialization.Encoding.PEM), private=False)
    _write(paths.serving_key, _pem_key(serving_key), private=True)

    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin = _cert(
        subject=x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                x509.NameAttribute(NameOID.COMMON_NAME, "rolloutpool-admin"),
            ]
        ),
        issuer=ca_name,
        public_key=admin_key.public_key(),
        signer=ca_key,
        is_ca=False,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
        sans=[],
    )
    _write(paths.admin_cert, admin.public_bytes(serialization.Encoding.PEM), private=False)
    _write(paths.admin_key, _pem_key(admin_key), private=True)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(paths.sa_key, _pem_key(sa_key), private=True)
    _write(
        paths.sa_pub,
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        private=False,
    )
    return paths
