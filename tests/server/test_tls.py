"""`swarm serve --ssl-certfile --ssl-keyfile`: HTTPS for clients on other machines, whose bearer tokens
would otherwise cross the network readable; a server reachable off loopback over plain HTTP says so.

The certificate is made here (a self-signed one for 127.0.0.1); a client trusts it the usual way,
`SSL_CERT_FILE`, which httpx (the SDK and the OpenAI client under it) reads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError
from tls_certs import self_signed  # tests/kit, on sys.path

from swarm.children import stop, swarm_command, wait_announced
from swarm.config.server import ServerConfig
from swarm.server.bootstrap import clear_text_note, tls_problem

TOKEN = "tls-worker-token"


PLAY = """
from swarm.client import SwarmClient
client = SwarmClient(URL, TOKEN)
ep = client.claim("t1")
reply = ep.openai.chat.completions.create(model="m", messages=[{"role": "user", "content": "2+3?"}], max_tokens=4)
print("played", ep.finish(1.0).status, reply.choices[0].finish_reason)
client.close()
"""


def test_an_https_server_plays_an_episode_with_a_client_that_trusts_its_certificate(
    tmp_path: Path, model_dir: Path
) -> None:
    key, cert = self_signed(tmp_path)
    out = tmp_path / "serve"
    log = tmp_path / "serve.log"
    args = ["serve", "--engine", "fake", "--model", str(model_dir), "--port", "0", "--out", str(out), "--no-mlflow"]
    args += ["--model-name", "m", "--token", TOKEN, "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
    with log.open("w") as f:
        server = subprocess.Popen(swarm_command(*args), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = wait_announced(out / "server.json", server, log, timeout=120)
        assert url.startswith("https://127.0.0.1:"), url
        assert httpx.get(f"{url}/health", verify=str(cert)).status_code == 200
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{url}/health")  # a client that does not trust the certificate is refused by its own TLS
        with pytest.raises(httpx.HTTPError):
            httpx.get(url.replace("https://", "http://") + "/health")  # plain HTTP is not answered
        env = {**os.environ, "SSL_CERT_FILE": str(cert)}
        script = PLAY.replace("URL", repr(url)).replace("TOKEN", repr(TOKEN))
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0 and "played finished" in r.stdout, r.stdout + r.stderr
        assert "plain HTTP" not in log.read_text()  # no clear-text note: it is HTTPS (and on loopback)
    finally:
        stop(server)


def test_tls_problems_and_the_clear_text_note() -> None:
    assert tls_problem(ServerConfig()) is None
    missing = ServerConfig(ssl_certfile=Path("/nonexistent/c.pem"), ssl_keyfile=Path("/nonexistent/k.pem"))
    assert tls_problem(missing) == "--ssl-certfile /nonexistent/c.pem: no such file"
    with pytest.raises(ValidationError, match="--ssl-keyfile needs --ssl-certfile"):
        ServerConfig(ssl_keyfile=Path("k.pem"))
    for host in ("127.0.0.1", "::1", "localhost"):
        assert clear_text_note(ServerConfig(host=host)) is None, host
    note = clear_text_note(ServerConfig(host="0.0.0.0"))
    assert note is not None and "plain HTTP on 0.0.0.0" in note and "--ssl-certfile" in note
    assert clear_text_note(ServerConfig(host="0.0.0.0", ssl_certfile=Path("c"), ssl_keyfile=Path("k"))) is None


def test_a_garbage_certificate_is_said(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    said = tls_problem(ServerConfig(ssl_certfile=junk, ssl_keyfile=junk))
    assert said is not None and said.startswith(f"cannot serve HTTPS with {junk}"), said


def test_an_encrypted_key_is_said_not_prompted_for(tmp_path: Path) -> None:
    """OpenSSL asks for the passphrase of an encrypted key on the terminal: without one, a server that hangs."""
    from cryptography.hazmat.primitives import serialization

    key, cert = self_signed(tmp_path)
    loaded = serialization.load_pem_private_key(key.read_bytes(), password=None)
    locked = tmp_path / "locked.key"
    locked.write_bytes(
        loaded.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    said = tls_problem(ServerConfig(ssl_certfile=cert, ssl_keyfile=locked))
    assert said is not None and said.startswith(f"cannot serve HTTPS with {cert} and {locked}"), said
