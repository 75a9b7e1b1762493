"""The consumers, split by role as RocketMQ's Java client names its parts.

- :mod:`.config`: ConsumerConfig (what every group member shares), PushConfig, LitePullConfig,
  SimpleConfig: each setting with its default and rule, written once;
- :mod:`.subscription`: :class:`~.subscription.Subscription`, a validated topic subscription;
- :mod:`.member`: :class:`~.member.GroupMember`, what the push and lite pull consumers share
  (connections, heartbeat, rebalance, offsets, the brokers' requests);
- :mod:`.puller`: :class:`~.puller.PullMessageService`, the long-polling pull loop per queue;
- :mod:`.listener`: runs the application's listener (thread pool or ``async def``) and sends
  failed messages back;
- :mod:`.concurrent`: :class:`~.concurrent.ConsumeMessageConcurrentlyService`;
- :mod:`.orderly`: :class:`~.orderly.ConsumeMessageOrderlyService`;
- :mod:`.push`, :mod:`.lite_pull`, :mod:`.simple`: the consumers, async and blocking.

Import names from their modules (or from :mod:`orbitmq.client`); this package imports nothing.
"""
