"""TLS for the HTTP and gRPC listeners from a PEM certificate chain and private key.

Rule of this file: read the files once at start-up and fail loudly (OSError / ssl.SSLError
naming the file) rather than serve plaintext by accident. TLS 1.2 is the minimum; HTTP
offers ALPN `http/1.1` (aiohttp serves HTTP/1.1 only); gRPC gets the same pair through
`grpc.ssl_server_credentials`.
"""

from __future__ import annotations

import ssl
from pathlib import Path


def server_ssl_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """An SSLContext for the HTTP listener; raises OSError or ssl.SSLError on bad files.

    An encrypted private key is refused with an error naming the file (the process must
    never block on a passphrase prompt).
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2

    def no_passphrase() -> str:
        raise OSError(f"TLS key file {key_file} is encrypted; give an unencrypted PEM key")

    context.load_cert_chain(cert_file, key_file, password=no_passphrase)
    context.set_alpn_protocols(["http/1.1"])
    return context


def read_pem_pair(cert_file: str, key_file: str) -> tuple[bytes, bytes]:
    """(certificate chain, private key) as PEM bytes for gRPC; raises OSError."""
    return Path(cert_file).read_bytes(), Path(key_file).read_bytes()
