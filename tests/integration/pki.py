"""A throwaway certificate authority for TLS tests, made with ``cryptography``: a CA,
certificates it signs (a server's with localhost in its SAN, clients' by common name)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here
    #: Client certificates and keys by common name (``client_cert`` is "agent-1"'s).
    clients: dict[str, tuple[Path, Path]]


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def write_key(private: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    san: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def make_pki(d: Path, clients: tuple[str, ...] = ()) -> Pki:
    """A CA under ``d``, a server certificate for localhost, and client certificates for
    "agent-1" and each common name of ``clients``."""
    ca_key = new_key()
    ca = cert("hetero test CA", ca_key, None, ca=True)
    server_key, other_key = new_key(), new_key()
    signed: dict[str, tuple[Path, Path]] = {}
    for name in ("agent-1", *clients):
        k = new_key()
        signed[name] = (
            write_cert(cert(name, k, (ca, ca_key)), d / f"{name}.pem"),
            write_key(k, d / f"{name}.key"),
        )
    return Pki(
        ca=write_cert(ca, d / "ca.pem"),
        server_cert=write_cert(
            cert("coordinator", server_key, (ca, ca_key), san=True), d / "s.pem"
        ),
        server_key=write_key(server_key, d / "s.key"),
        client_cert=signed["agent-1"][0],
        client_key=signed["agent-1"][1],
        other_ca=write_cert(cert("other CA", other_key, None, ca=True), d / "other.pem"),
        clients=signed,
    )
