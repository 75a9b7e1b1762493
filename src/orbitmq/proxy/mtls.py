"""The user a gRPC call's verified client certificate names (mutual TLS on the proxy).

gRPC terminates TLS itself (in both TLS modes: ``required`` binds its TLS port, ``permissive``
splices TLS connections to it) and puts the client certificate it verified in the call's auth
context (``x509_pem_cert``). The identity rule is the Remoting one,
:func:`orbitmq.net.tls.peer_identity` (first DNS or IP subjectAltName, else the subject CN),
applied to the certificate shaped as ``ssl.SSLSocket.getpeercert()`` shapes it, so a
certificate names the same user on a broker, a NameServer and the proxy.

gRPC's own ``x509_subject_alternative_name`` values cannot be used for that: they lose each
name's type (a DNS name and a URI look alike) and so the rule's order. Parsed certificates are
remembered by their PEM (a client shows the same one on every call of its connection).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from orbitmq.net.tls import peer_identity

PEM_PROPERTY = "x509_pem_cert"
"""The auth-context property gRPC fills with the verified peer certificate (PEM)."""
MAX_REMEMBERED = 1024
"""Certificates whose principal is kept; the table is emptied when it is full."""


def _ip_text(ip: ipaddress.IPv4Address | ipaddress.IPv6Address | Any) -> str:
    """An IP subjectAltName as CPython's ``_ssl`` prints it (IPv6: eight uppercase hex groups,
    uncompressed), so the principal is the string a Remoting connection would see."""
    if isinstance(ip, ipaddress.IPv6Address):
        return ":".join(f"{int(group, 16):X}" for group in ip.exploded.split(":"))
    return str(ip)


def certificate_fields(pem: bytes) -> dict[str, Any] | None:
    """``pem`` as ``getpeercert()`` would give it: ``subject`` (its commonName attributes) and
    ``subjectAltName`` (DNS, IP Address, URI and email names, in certificate order), the
    fields peer_identity reads. None: not a certificate."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return None
    subject = tuple(
        (("commonName", str(attr.value)),)
        for attr in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    )
    fields: dict[str, Any] = {"subject": subject}
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return fields
    names: list[tuple[str, str]] = []
    for name in san:
        if isinstance(name, x509.DNSName):
            names.append(("DNS", name.value))
        elif isinstance(name, x509.IPAddress):
            names.append(("IP Address", _ip_text(name.value)))
        elif isinstance(name, x509.UniformResourceIdentifier):
            names.append(("URI", name.value))
        elif isinstance(name, x509.RFC822Name):
            names.append(("email", name.value))
    if names:
        fields["subjectAltName"] = tuple(names)
    return fields


class CertPrincipals:
    """``principal(auth_context)``: the user the call's verified certificate names, or None
    (no certificate, or one that names nobody)."""

    def __init__(self) -> None:
        self._known: dict[bytes, str | None] = {}

    def principal(self, auth_context: Mapping[str, Iterable[bytes]]) -> str | None:
        pems = list(auth_context.get(PEM_PROPERTY, ()))
        if not pems:
            return None
        pem = pems[0]
        if pem in self._known:
            return self._known[pem]
        name = peer_identity(certificate_fields(pem))
        if len(self._known) >= MAX_REMEMBERED:
            self._known.clear()
        self._known[pem] = name
        return name
