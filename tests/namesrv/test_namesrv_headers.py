"""The NameServer answers exactly the codes whose header classes say NameServer, built by them."""

from __future__ import annotations

from orbitmq.common.codes import ResponseCode
from orbitmq.namesrv.processor import NamesrvProcessor
from orbitmq.namesrv.route_info import RouteInfoManager
from orbitmq.protocol.bodies import (
    RegisterBrokerBody,
    TopicConfig,
    TopicRouteData,
    decode_body,
    encode_body,
)
from orbitmq.protocol.requests import (
    REQUESTS,
    DeleteTopicInNamesrvRequest,
    GetRouteInfoRequest,
    RegisterBrokerRequest,
)


def test_the_namesrv_codes_are_the_nameserver_section() -> None:
    processor = NamesrvProcessor(RouteInfoManager())
    listed = {code for code, cls in REQUESTS.items() if cls.section == "nameserver"}
    assert processor.codes == listed


def test_requests_built_by_the_classes_are_served() -> None:
    processor = NamesrvProcessor(RouteInfoManager())
    body = RegisterBrokerBody(topic_configs={"T": TopicConfig(topic_name="T")})
    register = RegisterBrokerRequest(
        cluster="C", broker_name="b", broker_id=0, broker_addr="127.0.0.1:10911"
    )
    assert processor.process(register.frame(encode_body(body))).code == ResponseCode.SUCCESS
    route = processor.process(GetRouteInfoRequest(topic="T").frame())
    assert route.code == ResponseCode.SUCCESS
    assert [b.broker_name for b in decode_body(route.body, TopicRouteData).broker_datas] == ["b"]
    other = DeleteTopicInNamesrvRequest(topic="T", cluster="other").frame()
    assert other.fields == {"topic": "T", "cluster": "other"}
    assert processor.process(other).code == ResponseCode.SUCCESS
    assert processor.process(GetRouteInfoRequest(topic="T").frame()).code == ResponseCode.SUCCESS
    gone = processor.process(DeleteTopicInNamesrvRequest(topic="T").frame())
    assert gone.code == ResponseCode.SUCCESS
    missing = processor.process(GetRouteInfoRequest(topic="T").frame())
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST
    bad = processor.process(GetRouteInfoRequest(topic="a b").frame())
    assert bad.code == ResponseCode.MESSAGE_ILLEGAL and "outside" in bad.remark
