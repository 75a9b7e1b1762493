"""``python -m orbitmq ...``: the ``orbitmq`` command (as ``python -m uvicorn`` is uvicorn's).

The one way to run a server from a script or a test that has only an interpreter:
``python -m orbitmq broker --config broker.toml``.
"""

from orbitmq.cli.main import main

main()
