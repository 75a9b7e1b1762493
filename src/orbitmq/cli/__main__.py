"""``python -m orbitmq.cli``: the same as the ``orbitmq`` command."""

from orbitmq.cli.main import main

main()
