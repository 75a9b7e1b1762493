"""In-process servers for the body of an ``async with`` (like uvicorn's test server):

    async with run_namesrv() as ns, run_broker(namesrv=ns.address) as broker:
        ...  # clients talk to ns.address / broker.address

Each listens on a free port of 127.0.0.1 and is stopped when the block ends, whether it raised
or not; a broker without a config gets a small store in a temporary folder, removed after.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.controller import BrokerController
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.testing.config import small_broker_config


@contextlib.asynccontextmanager
async def run_namesrv(config: NamesrvConfig | None = None) -> AsyncIterator[NamesrvController]:
    """A started NameServer (default: 127.0.0.1, a free port)."""
    namesrv = NamesrvController(config or NamesrvConfig(port=0))
    await namesrv.start()
    try:
        yield namesrv
    finally:
        await namesrv.stop()


@contextlib.asynccontextmanager
async def run_broker(
    config: BrokerConfig | None = None, *, namesrv: str | None = None
) -> AsyncIterator[BrokerController]:
    """A started broker: ``config`` as given, else :func:`small_broker_config` in a temporary
    folder, registered with ``namesrv`` (host:port) when given."""
    async with contextlib.AsyncExitStack() as stack:
        if config is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="orbitmq-test-"))
            addrs = (namesrv,) if namesrv else ()
            config = small_broker_config(Path(folder) / "store", namesrv_addrs=addrs)
        broker = BrokerController(config)
        await broker.start()
        try:
            yield broker
        finally:
            await broker.stop()
