"""NATS over TLS where configured: the server config from `qshare.natsauth` with a
certificate, and services connecting with `nats_tls_ca` (issue 11, NATS design gap)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import nats
import pytest

from qshare.bus import close, connect
from qshare.natsauth import NatsAuth, ServerTls, ServiceRole
from qshare.testing.servers import EmbeddedNats
from qshare_api.settings import ApiSettings

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _certificates(directory: Path) -> ServerTls:
    """A CA and a server certificate for 127.0.0.1 it signed."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=qs-ca",
            "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "server.key", "-out", "server.csr")  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-extfile", "san.ext",
            "-out", "server.pem")  # fmt: skip
    return ServerTls(directory / "server.pem", directory / "server.key", None)


async def test_a_service_connects_over_tls_and_a_plain_connection_is_refused(
    tmp_path: Path,
) -> None:
    tls = _certificates(tmp_path)
    identities = NatsAuth.generate()
    api = identities.credentials(ServiceRole.API)
    async with EmbeddedNats(config=identities.server_config(tls)) as server:
        settings = ApiSettings(
            nats_url=server.url, nats_user=api.user, nats_password=api.password,
            nats_tls_ca=tmp_path / "ca.pem",
        )  # fmt: skip
        nc = await connect(settings.bus("tls-test"))
        assert nc.is_connected
        await close(nc)
        with pytest.raises(Exception):  # noqa: B017 - refused however nats.py words it
            await nats.connect(
                server.url, user=api.user, password=api.password.get_secret_value(),
                allow_reconnect=False, connect_timeout=2,
            )  # fmt: skip
