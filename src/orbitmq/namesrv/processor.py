"""NameServer request handling: a request frame in, a response frame out (see docs/protocol.md).

Every field and body is checked before the route tables are touched, so a request that is
refused changes nothing. The header classes of ``orbitmq.protocol.requests`` check the fields
(names, ids, addresses, topics); a missing field, a value of the wrong type or out of range, or
a body that does not decode is MESSAGE_ILLEGAL (13) with a remark naming the field, as the
broker answers; an unknown request code is REQUEST_CODE_NOT_SUPPORTED. The transport answers
nothing of this on its own once a handler is installed, so it is done here, for every code.

``process`` is also the NameServer's one point of authentication and authorization: with
``auth`` given, every request first passes ``ServerAuth.before`` (orbitmq.auth), which refuses
it (NO_PERMISSION) or answers the user/ACL admin codes itself.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import msgspec

from orbitmq.auth.server import ServerAuth
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.common.validation import validate_topic
from orbitmq.namesrv.route_info import Registration, RouteInfoManager
from orbitmq.protocol.bodies import (
    MESSAGE_TYPES,
    PERM_INHERIT,
    PERM_READ_WRITE,
    RegisterBrokerBody,
    decode_body,
    encode_body,
)
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.config_requests import parse_properties
from orbitmq.protocol.fields import FieldError
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.requests import (
    AddWritePermRequest,
    DeleteTopicInNamesrvRequest,
    GetRouteInfoRequest,
    RegisterBrokerRequest,
    UnregisterBrokerRequest,
    WipeWritePermRequest,
)

MAX_QUEUE_NUMS = 65535
_ALL_PERMS = PERM_READ_WRITE | PERM_INHERIT

Handler = Callable[[Frame, Hashable | None], Frame]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def register_body(data: bytes | bytearray | memoryview) -> RegisterBrokerBody:
    """Decode and check a RegisterBrokerBody; FieldError says what is wrong."""
    try:
        body = decode_body(memoryview(data), RegisterBrokerBody)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise FieldError(f"body is not a RegisterBrokerBody: {exc}") from None
    for key, tc in body.topic_configs.items():
        if key != tc.topic_name:
            raise FieldError(f"topic_configs[{_short(key)}] holds topic {_short(tc.topic_name)}")
        validate_topic(key)
        for attr in ("read_queue_nums", "write_queue_nums"):
            nums = getattr(tc, attr)
            if not 0 <= nums <= MAX_QUEUE_NUMS:
                raise FieldError(f"topic {key}: {attr} = {nums} is outside [0, {MAX_QUEUE_NUMS}]")
        if not 0 <= tc.perm <= _ALL_PERMS:
            raise FieldError(f"topic {key}: perm = {tc.perm} is not a combination of 4, 2, 1")
        if tc.message_type not in MESSAGE_TYPES:
            raise FieldError(f"topic {key}: message_type {_short(tc.message_type)} is unknown")
    return body


class NamesrvProcessor:
    """Maps request codes to RouteInfoManager calls. Synchronous: the tables live on one loop."""

    def __init__(self, routes: RouteInfoManager, auth: ServerAuth | None = None) -> None:
        self.routes = routes
        self.auth = auth
        self._handlers: dict[int, Handler] = {
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_topic_list,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self.wipe_write_perm,
            RequestCode.ADD_WRITE_PERM_OF_BROKER: self.add_write_perm,
            RequestCode.UPDATE_NAMESRV_CONFIG: self.update_config,
            RequestCode.GET_NAMESRV_CONFIG: self.get_config,
        }
        self.codes = frozenset(self._handlers) | (frozenset() if auth is None else auth.codes)
        """The request codes this NameServer answers."""

    def process(self, request: Frame, connection: Hashable | None = None) -> Frame:
        """The response to ``request``; ``connection`` is remembered by REGISTER_BROKER."""
        if self.auth is not None:
            try:
                answer = self.auth.before(request, connection)
            except MQError as exc:
                return request.reply(exc.code, str(exc) or type(exc).__name__)
            if answer is not None:
                return answer
        handler = self._handlers.get(request.code)
        if handler is None:
            return request.reply(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f"request code {request.code} is not supported by the NameServer",
            )
        try:
            return handler(request, connection)
        except MQError as exc:
            return request.reply(exc.code, str(exc) or type(exc).__name__)

    # ------------------------------------------------------------------ brokers

    def register_broker(self, request: Frame, connection: Hashable | None) -> Frame:
        req = RegisterBrokerRequest.decode(request)
        body = register_body(request.body)
        result = self.routes.register_broker(
            Registration(
                cluster=req.cluster,
                broker_name=req.broker_name,
                broker_id=req.broker_id,
                broker_addr=req.broker_addr,
                topic_configs=body.topic_configs,
                data_version=body.data_version,
            ),
            connection,
        )
        fields = {} if result.master_addr is None else {"master_addr": result.master_addr}
        return request.reply(ResponseCode.SUCCESS, fields=fields)

    def unregister_broker(self, request: Frame, _connection: Hashable | None) -> Frame:
        req = UnregisterBrokerRequest.decode(request)
        self.routes.unregister_broker(req.broker_name, req.broker_id, req.broker_addr)
        return request.reply(ResponseCode.SUCCESS)

    def wipe_write_perm(self, request: Frame, _connection: Hashable | None) -> Frame:
        count = self.routes.wipe_write_perm(WipeWritePermRequest.decode(request).broker_name)
        return request.reply(ResponseCode.SUCCESS, fields={"wipe_topic_count": count})

    def add_write_perm(self, request: Frame, _connection: Hashable | None) -> Frame:
        count = self.routes.add_write_perm(AddWritePermRequest.decode(request).broker_name)
        return request.reply(ResponseCode.SUCCESS, fields={"add_topic_count": count})

    # ------------------------------------------------------------------ configuration

    def update_config(self, request: Frame, _connection: Hashable | None) -> Frame:
        """RocketMQ's UPDATE_NAMESRV_CONFIG (CVE-2023-37582 wrote a file through it): the
        NameServer has no runtime-changeable setting, so every key is refused and nothing is
        written; a malformed body is MESSAGE_ILLEGAL."""
        keys = parse_properties(request.body)
        if not keys:
            return request.reply(ResponseCode.SUCCESS)
        first = sorted(keys)[0]
        return request.reply(
            ResponseCode.NO_PERMISSION,
            f"config key {first[:64]!r} cannot be changed at runtime on the NameServer; "
            "nothing was changed",
        )

    def get_config(self, request: Frame, _connection: Hashable | None) -> Frame:
        return request.reply(ResponseCode.SUCCESS, body=b"")

    # ------------------------------------------------------------------ topics

    def get_route(self, request: Frame, _connection: Hashable | None) -> Frame:
        topic = GetRouteInfoRequest.decode(request).topic
        route = self.routes.topic_route(topic)
        if route is None:
            return request.reply(ResponseCode.TOPIC_NOT_EXIST, f"no route for topic {topic}")
        return request.reply(ResponseCode.SUCCESS, body=encode_body(route))

    def get_cluster_info(self, request: Frame, _connection: Hashable | None) -> Frame:
        return request.reply(ResponseCode.SUCCESS, body=encode_body(self.routes.cluster_info()))

    def get_topic_list(self, request: Frame, _connection: Hashable | None) -> Frame:
        return request.reply(ResponseCode.SUCCESS, body=encode_body(self.routes.topic_list()))

    def delete_topic(self, request: Frame, _connection: Hashable | None) -> Frame:
        req = DeleteTopicInNamesrvRequest.decode(request)
        self.routes.delete_topic(req.topic, req.cluster)
        return request.reply(ResponseCode.SUCCESS)
