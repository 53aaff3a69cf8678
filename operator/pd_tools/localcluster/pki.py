"""Certificates and keys for the local control plane, generated fresh for every cluster."""

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class KeyPair:
    """Paths of a PEM certificate and its private key."""

    cert: Path
    key: Path


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


class CertificateAuthority:
    """A throwaway CA that signs the apiserver's serving cert and the client certs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._subject = _name("pd-operator-local-ca")
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._subject)
            .issuer_name(self._subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = directory / "ca.crt"
        self.cert_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self._key, directory / "ca.key")
        self.key_path = directory / "ca.key"

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organization: str | None = None,
        server: bool = False,
    ) -> KeyPair:
        """Issue a client (or, with server=True, a loopback serving) certificate."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organization))
            .issuer_name(self._subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.DNSName("kubernetes.default.svc"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair


def service_account_keys(directory: Path) -> KeyPair:
    """The key pair that signs service-account tokens (`cert` holds the public key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    _write_key(key, pair.key)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair
