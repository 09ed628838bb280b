"""The C extension of the produce path's record walk; everything else is in pyproject.toml.

Optional: where it cannot be built, `tierbroker.protocol.records.validation` walks records in
Python instead (several times slower on produce) and logs a warning.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("tierbroker.protocol.records._walk", ["protocol/records/_walk.c"], optional=True),
    ]
)
