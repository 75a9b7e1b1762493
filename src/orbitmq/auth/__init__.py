"""Authentication, authorization (RocketMQ ACL 2.0's model), the user/ACL store and the audit
log, shared by the broker, the NameServer and the proxy (docs/security.md).

Layer: above ``protocol`` and ``common``, beside ``net`` and ``store``; services import it, it
imports no service. The wire side of signatures (what a client adds) is
``orbitmq.protocol.signature``.
"""
