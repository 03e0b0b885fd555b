"""TLS on both listeners from a certificate and key in the config: a self-signed
certificate made at test time, trusted by the clients, and no plaintext on those ports."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
import pytest_asyncio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from helpers import own_app
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from homing.app import App
from homing.config import GatewaySettings, HomingConfig, SimSettings
from homing.v1 import inference_pb2 as pb
from homing.v1 import inference_pb2_grpc as pb_grpc

pytestmark = pytest.mark.asyncio(loop_scope="module")


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A P-256 certificate for 127.0.0.1 and localhost, valid for a day, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "homing-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file = directory / "cert.pem"
    key_file = directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tls_app(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[App, Path]]:
    """A gateway serving TLS on HTTP and gRPC, and the certificate file clients trust."""
    cert_file, key_file = self_signed(tmp_path_factory.mktemp("tls"))
    config = HomingConfig(
        gateway=GatewaySettings(
            port=0,
            grpc_port=0,
            drain_timeout_s=1.0,
            tls_cert_file=str(cert_file),
            tls_key_file=str(key_file),
        ),
        sim=SimSettings(workers=1, speedup=10.0),
    )
    async with own_app(config) as app:
        yield app, cert_file


async def test_https_serves_the_openai_api(tls_app: tuple[App, Path]) -> None:
    """A client trusting the test certificate gets a chat completion over HTTPS."""
    app, cert_file = tls_app
    context = ssl.create_default_context(cafile=str(cert_file))
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"https://127.0.0.1:{app.http_port}/v1/chat/completions",
            json={
                "model": app.model.model_id,  # type: ignore[union-attr]
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            },
            ssl=context,
        ) as resp:
            assert resp.status == 200
            body = await resp.json()
    assert body["object"] == "chat.completion"


async def test_official_client_works_over_https(tls_app: tuple[App, Path]) -> None:
    """The `openai` client lists models over HTTPS with the certificate trusted."""
    app, cert_file = tls_app
    context = ssl.create_default_context(cafile=str(cert_file))
    async with DefaultAsyncHttpxClient(verify=context) as http:
        client = AsyncOpenAI(
            base_url=f"https://localhost:{app.http_port}/v1", api_key="unused", http_client=http
        )
        models = await client.models.list()
    assert [m.id for m in models.data] == [app.model.model_id]  # type: ignore[union-attr]


async def test_plaintext_http_is_not_served_on_the_tls_port(tls_app: tuple[App, Path]) -> None:
    """A plain HTTP request to the TLS port gets no HTTP response."""
    app, _ = tls_app
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"http://127.0.0.1:{app.http_port}/health") as resp:
                await resp.read()


async def test_untrusted_certificate_is_refused_by_a_verifying_client(
    tls_app: tuple[App, Path],
) -> None:
    """Without the test CA the client's verification fails: TLS is really on."""
    app, _ = tls_app
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(f"https://127.0.0.1:{app.http_port}/health")


async def test_grpc_over_tls_lists_models(tls_app: tuple[App, Path]) -> None:
    """A gRPC channel with the test certificate as root calls ListModels; a plaintext one
    cannot."""
    app, cert_file = tls_app
    credentials = grpc.ssl_channel_credentials(root_certificates=cert_file.read_bytes())
    async with grpc.aio.secure_channel(f"localhost:{app.grpc_port}", credentials) as channel:
        listed = await pb_grpc.InferenceStub(channel).ListModels(pb.ListModelsRequest())
    assert [m.id for m in listed.models] == [app.model.model_id]  # type: ignore[union-attr]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await pb_grpc.InferenceStub(channel).ListModels(pb.ListModelsRequest(), timeout=2)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_encrypted_key_is_refused_naming_the_file(tmp_path: Path) -> None:
    """An encrypted private key fails at start-up with its file named, never a prompt."""
    from homing.gateway.tls import server_ssl_context

    cert_file, key_file = self_signed(tmp_path)
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    locked = tmp_path / "locked.pem"
    locked.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(OSError, match=f"TLS key file {locked} is encrypted"):
        server_ssl_context(str(cert_file), str(locked))
