"""Builds the optional C extensions ``orbitmq._native`` and ``orbitmq._kafka_native`` (everything
else is in pyproject.toml).

``optional=True``: on a machine without a working C compiler the build of the extension is
skipped with a warning and the install still succeeds; OrbitMQ then uses its pure-Python codec
(orbitmq/common/native.py). ``ORBITMQ_NATIVE=0`` at install skips the build, and at run time
makes a present extension unused.
"""

import os

from setuptools import Extension, setup

extensions = []
if os.environ.get("ORBITMQ_NATIVE", "1") != "0":
    extensions.append(
        Extension(
            "orbitmq._native",
            [
                "src/orbitmq/_native.c",
                "src/orbitmq/_native_columns.c",
                "src/orbitmq/_native_seal.c",
            ],
            depends=["src/orbitmq/_crc32c.h", "src/orbitmq/_record.h"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    )
    extensions.append(
        Extension(
            "orbitmq._kafka_native",
            ["src/orbitmq/_kafka_native.c"],
            depends=["src/orbitmq/_crc32c.h"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    )

setup(ext_modules=extensions)
