"""Credentials for a Flower deployment you run yourself: a CA and a server certificate for the
SuperLink's TLS, and EC key pairs (OpenSSH format) that authenticate SuperNodes.

For trying a deployment on one machine or a private network (``examples/flower``, the tests);
an organisation's own PKI is the place for production certificates. Command line::

    python -m fedgp.flower.security tls certificates/ --host 127.0.0.1 --host localhost
    python -m fedgp.flower.security node-key keys/node-1
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["make_tls", "make_node_key"]


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(key, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def make_tls(folder: str | Path, hosts: Sequence[str] = ("127.0.0.1", "localhost"), days: int = 30) -> dict:
    """``ca.crt``/``ca.key`` and ``server.pem``/``server.key`` (valid for ``hosts``) in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("fedgp test CA"))
        .issuer_name(_name("fedgp test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    names = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_key = ec.generate_private_key(ec.SECP384R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {name: folder / name for name in ("ca.crt", "ca.key", "server.pem", "server.key")}
    paths["ca.crt"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(ca_key, paths["ca.key"])
    paths["server.pem"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    _write_key(server_key, paths["server.key"])
    return paths


def make_node_key(path: str | Path) -> tuple[Path, Path]:
    """An EC (P-384) key pair for SuperNode authentication: ``path`` (private, OpenSSH format) and
    ``path.pub`` (public, to register with ``flwr supernode register``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)
    public = path.with_name(path.name + ".pub")
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    return path, public


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fedgp.flower.security", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="what", required=True)
    tls = sub.add_parser("tls", help="a CA and a SuperLink server certificate")
    tls.add_argument("folder")
    tls.add_argument("--host", action="append", default=None, help="a name or IP the SuperLink is reached at")
    key = sub.add_parser("node-key", help="a SuperNode authentication key pair")
    key.add_argument("path")
    args = parser.parse_args(argv)
    if args.what == "tls":
        for path in make_tls(args.folder, args.host or ("127.0.0.1", "localhost")).values():
            print(f"wrote {path}")
    else:
        for path in make_node_key(args.path):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
