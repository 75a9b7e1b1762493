"""SCRAM-SHA-256 (orbitmq.auth.scram): RFC 7677's example exchange, and the server refusing
what it must refuse."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest

from orbitmq.auth.scram import ScramError, ScramServer, client_proof

SECRETS = {"user": "pencil", "a,b=c": "s3cret"}


def test_rfc7677_example() -> None:
    bare = "n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = (
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    final, sig = client_proof("user", "pencil", bare, server_first)
    assert final == (
        "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert base64.b64encode(sig) == b"6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


@pytest.mark.parametrize(("name", "wire"), [("user", "user"), ("a,b=c", "a=2Cb=3Dc")])
def test_server_accepts_the_right_secret(name: str, wire: str) -> None:
    server = ScramServer(SECRETS.get)
    bare = f"n={wire},r=abc"
    first = server.first(f"n,,{bare}".encode()).decode()
    final, sig = client_proof(name, SECRETS[name], bare, first)
    assert server.final(final.encode()) == (name, b"v=" + base64.b64encode(sig))


@pytest.mark.parametrize(
    "change",
    [
        lambda f: f.replace("p=", "p=A"),  # a different proof
        lambda f: f.replace("r=abc", "r=abd"),  # another nonce
        lambda f: f.replace("c=biws", "c=eSws"),  # another GS2 header
        lambda f: f.rpartition(",p=")[0],  # no proof
        lambda f: "\xff",
    ],
)
def test_server_refuses_tampering(change: Callable[[str], str]) -> None:
    server = ScramServer(SECRETS.get)
    first = server.first(b"n,,n=user,r=abc").decode()
    final, _ = client_proof("user", "pencil", "n=user,r=abc", first)
    with pytest.raises(ScramError):
        server.final(change(final).encode())


@pytest.mark.parametrize(
    "first", [b"p=tls-unique,,n=user,r=a", b"n,,r=a", b"n,,n=user", b"x", b"n,,n=u=x,r=a", b"\xff"]
)
def test_server_refuses_bad_client_first(first: bytes) -> None:
    with pytest.raises(ScramError):
        ScramServer(SECRETS.get).first(first)


def test_unknown_user_fails_only_at_the_proof() -> None:
    server = ScramServer(SECRETS.get)
    first = server.first(b"n,,n=ghost,r=abc").decode()  # answered like a known user
    final, _ = client_proof("ghost", "anything", "n=ghost,r=abc", first)
    with pytest.raises(ScramError):
        server.final(final.encode())
