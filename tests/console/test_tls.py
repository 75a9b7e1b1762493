"""The console over HTTPS (issue #16, "TLS on every listener ... console"): with a certificate
it serves HTTPS with exactly that certificate, a plaintext HTTP request gets no answer, and with
a client CA a client without a certificate of that CA is refused in the handshake."""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from orbitmq.common.errors import ConfigError
from orbitmq.console.auth import hash_password
from orbitmq.console.config import ConsoleConfig
from orbitmq.console.serve import serve_console
from tests.net.pki import Ca

NOWHERE = ("127.0.0.1:1",)  # no cluster needed for a static file


def _get(url: str, ctx: ssl.SSLContext | None) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
        return int(resp.status), bytes(resp.read())


def _plain_request(port: int) -> bytes:
    """A plaintext HTTP request to the port; whatever comes back before the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /static/htmx.min.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        got = b""
        for _ in range(100):  # bounded: until the server closes
            try:
                chunk = sock.recv(4096)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            got += chunk
        return got


def _login_cookie(port: int, ctx: ssl.SSLContext | None) -> str:
    """The Set-Cookie header of a successful console login (no redirect followed)."""
    conn: http.client.HTTPConnection
    if ctx is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=ctx)
    try:
        conn.request(
            "POST", "/login", body="user=ann&password=pw",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == 303, resp.status
        return str(resp.getheader("set-cookie"))
    finally:
        conn.close()


def _fetch(conn: http.client.HTTPConnection) -> int:
    """One request on a kept-alive connection (request and answer in one thread)."""
    conn.request("GET", "/static/htmx.min.js")
    resp = conn.getresponse()
    assert resp.read()
    return int(resp.status)


def _served_cert(port: int, ctx: ssl.SSLContext) -> x509.Certificate:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
        return x509.load_der_x509_certificate(der)


async def test_console_serves_https_with_its_certificate_and_refuses_plaintext(
    tmp_path: Path,
) -> None:
    ca = Ca.make(tmp_path)
    cert, key = ca.issue(tmp_path, "console", ip="127.0.0.1")
    cfg = ConsoleConfig(
        namesrv_addrs=NOWHERE, port=0, audit_log=str(tmp_path / "a.jsonl"),
        tls_cert_file=str(cert), tls_key_file=str(key),
        users={"ann": "admin:" + hash_password("pw", iterations=1000)},
    )  # fmt: skip
    async with serve_console(cfg) as url:
        assert url.startswith("https://127.0.0.1:")
        port = int(url.rsplit(":", 1)[1])
        trusting = ssl.create_default_context(cafile=str(ca.file))
        status, body = await asyncio.to_thread(_get, f"{url}/static/htmx.min.js", trusting)
        assert status == 200 and body
        served = await asyncio.to_thread(_served_cert, port, trusting)
        assert served == x509.load_pem_x509_certificate(cert.read_bytes())
        # a client that does not trust the CA (system roots) refuses the console
        with pytest.raises(urllib.error.URLError):
            await asyncio.to_thread(_get, f"{url}/static/htmx.min.js", ssl.create_default_context())
        answer = await asyncio.to_thread(_plain_request, port)
        assert b"HTTP/" not in answer and b"htmx" not in answer
        # the session cookie is marked Secure: never sent back over plain HTTP
        cookie = await asyncio.to_thread(_login_cookie, port, trusting)
        assert "orbitmq_console=" in cookie and "secure" in cookie.lower()
    plain = dataclasses.replace(cfg, tls_cert_file=None, tls_key_file=None)
    async with serve_console(plain) as url:
        assert url.startswith("http://")
        cookie = await asyncio.to_thread(_login_cookie, int(url.rsplit(":", 1)[1]), None)
        assert "orbitmq_console=" in cookie and "secure" not in cookie.lower()


async def test_console_with_a_client_ca_requires_a_client_certificate(tmp_path: Path) -> None:
    ca = Ca.make(tmp_path)
    other = Ca.make(tmp_path, "other-ca")
    cert, key = ca.issue(tmp_path, "console", ip="127.0.0.1")
    good = ca.issue(tmp_path, "operator")
    bad = other.issue(tmp_path, "intruder")
    cfg = ConsoleConfig(
        namesrv_addrs=NOWHERE, port=0, audit_log=str(tmp_path / "a.jsonl"),
        tls_cert_file=str(cert), tls_key_file=str(key), tls_ca_file=str(ca.file),
    )  # fmt: skip
    async with serve_console(cfg) as url:
        page = f"{url}/static/htmx.min.js"

        def client(pair: tuple[Path, Path] | None) -> ssl.SSLContext:
            ctx = ssl.create_default_context(cafile=str(ca.file))
            if pair is not None:
                ctx.load_cert_chain(str(pair[0]), str(pair[1]))
            return ctx

        status, _ = await asyncio.to_thread(_get, page, client(good))
        assert status == 200
        for pair in (None, bad):
            with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
                await asyncio.to_thread(_get, page, client(pair))


def test_a_client_ca_without_a_certificate_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        ConsoleConfig(tls_ca_file="ca.pem")
    assert ConsoleConfig().tls_source() is None  # off by default (loopback)


async def test_console_serves_a_replaced_certificate_without_a_restart(tmp_path: Path) -> None:
    """Files replaced in place: new handshakes get the new certificate within 2 s (brief T9),
    same port, same server; a connection opened before keeps working."""
    ca = Ca.make(tmp_path)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    old_cert, old_key = ca.issue(first, "console", ip="127.0.0.1")
    new_cert, new_key = ca.issue(second, "console", ip="127.0.0.1")
    live_cert, live_key = tmp_path / "console.crt", tmp_path / "console.key"
    live_cert.write_bytes(old_cert.read_bytes())
    live_key.write_bytes(old_key.read_bytes())
    cfg = ConsoleConfig(
        namesrv_addrs=NOWHERE, port=0, audit_log=str(tmp_path / "a.jsonl"),
        tls_cert_file=str(live_cert), tls_key_file=str(live_key),
    )  # fmt: skip
    trusting = ssl.create_default_context(cafile=str(ca.file))
    wanted = x509.load_pem_x509_certificate(new_cert.read_bytes())
    async with serve_console(cfg) as url:
        port = int(url.rsplit(":", 1)[1])
        served = await asyncio.to_thread(_served_cert, port, trusting)
        assert served == x509.load_pem_x509_certificate(old_cert.read_bytes())
        before = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=trusting)
        try:
            assert await asyncio.to_thread(_fetch, before) == 200
            kept = before.sock
            # replaced in place, certificate then key (a reader may see the pair half-written)
            live_cert.write_bytes(new_cert.read_bytes())
            live_key.write_bytes(new_key.read_bytes())
            start = time.monotonic()
            while served != wanted:
                assert time.monotonic() - start < 2.0, "the new certificate was not served in 2 s"
                await asyncio.sleep(0.1)
                served = await asyncio.to_thread(_served_cert, port, trusting)
            print(f"new certificate served after {time.monotonic() - start:.2f} s")
            assert url.endswith(f":{port}")
            # the connection made with the old certificate still works, on the same socket
            assert await asyncio.to_thread(_fetch, before) == 200
            assert before.sock is kept and isinstance(kept, ssl.SSLSocket)
            assert kept.getpeercert(binary_form=True) == x509.load_pem_x509_certificate(
                old_cert.read_bytes()
            ).public_bytes(serialization.Encoding.DER)
        finally:
            before.close()
