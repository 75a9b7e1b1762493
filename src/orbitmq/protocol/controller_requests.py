"""Header classes of the controller's request codes (docs/ha.md, "The controller").

Controller requests carry their arguments as a msgpack body (the Structs of
``orbitmq.protocol.controller``), not as header fields, so these classes declare no field: they
exist so that every request code has one class (``REQUESTS`` in protocol/requests.py), and so
that docs/protocol.md lists the controller's codes with their bodies and answers like every
other request.
"""

from __future__ import annotations

from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.header import Header


class _ControllerRequest(Header):
    section = "controller"


class BrokerHeartbeatRequest(_ControllerRequest):
    code = RequestCode.BROKER_HEARTBEAT
    body = "HeartbeatRequest: broker name and id, last epoch, max and confirm offsets, priority"
    response = "body HeartbeatResponse (the group's master and epochs; leader: this node leads)"


class ControllerAlterSyncStateSetRequest(_ControllerRequest):
    code = RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET
    body = "AlterSyncStateSetRequest: the proposed set with the master's epochs (compare-and-set)"
    response = "body ReplicaInfo; CONTROLLER_FENCED_* when an epoch is stale"


class ControllerElectMasterRequest(_ControllerRequest):
    code = RequestCode.CONTROLLER_ELECT_MASTER
    body = "ElectMasterRequest: group, requesting broker, optional designated broker"
    response = "body ReplicaInfo; CONTROLLER_MASTER_STILL_EXIST, CONTROLLER_ELECT_MASTER_FAILED"


class ControllerRegisterBrokerRequest(_ControllerRequest):
    code = RequestCode.CONTROLLER_REGISTER_BROKER
    body = "RegisterRequest: group, broker id, address"
    response = "body ReplicaInfo"


class ControllerGetReplicaInfoRequest(_ControllerRequest):
    code = RequestCode.CONTROLLER_GET_REPLICA_INFO
    body = "GetReplicaInfoRequest: group"
    response = "body ReplicaInfo (master, master epoch, SyncStateSet and its epoch, replicas)"


class ControllerGetMetadataRequest(_ControllerRequest):
    code = RequestCode.CONTROLLER_GET_METADATA_INFO
    response = "body ControllerMetadata (this node, the Raft leader, the peers)"


class NotifyBrokerRoleChangedRequest(_ControllerRequest):
    code = RequestCode.NOTIFY_BROKER_ROLE_CHANGED
    body = "ReplicaInfo"
    response = "none (one-way, controller to broker)"


class CleanBrokerDataRequest(_ControllerRequest):
    code = RequestCode.CLEAN_BROKER_DATA
    body = "CleanBrokerDataRequest: group, broker ids to forget"
    response = "no body"


class ControllerGetNextBrokerIdRequest(_ControllerRequest):
    code = RequestCode.CONTROLLER_GET_NEXT_BROKER_ID
    body = "GetNextBrokerIdRequest: cluster, group"
    response = "body NextBrokerId"


class ControllerApplyBrokerIdRequest(_ControllerRequest):
    code = RequestCode.CONTROLLER_APPLY_BROKER_ID
    body = "ApplyBrokerIdRequest: group, broker id, register check code"
    response = "body ReplicaInfo; CONTROLLER_BROKER_ID_INVALID when the id was taken"


class ControllerGetAuthDataRequest(_ControllerRequest):
    code = RequestCode.CONTROLLER_GET_AUTH_DATA
    body = "none; field version: the users-and-ACLs version the caller holds (-1: none)"
    response = (
        "field version; body: the sealed users-and-ACLs JSON document when newer than the "
        "caller's, else empty (auth_store raft only; docs/security.md)"
    )
