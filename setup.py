"""The C extensions; everything else is in pyproject.toml.

- `_walk`: the produce path's record walk. Optional: where it cannot be built,
  `tierbroker.protocol.records.validation` walks records in Python instead (several times
  slower on produce) and logs a warning.
- `_columns`: records as Arrow column buffers, for the Spark source. Optional: where it
  cannot be built (or on big-endian hosts), the source builds its columns from decoded
  records instead.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("tierbroker.protocol.records._walk", ["protocol/records/_walk.c"], optional=True),
        Extension(
            "tierbroker.protocol.records._columns", ["protocol/records/_columns.c"], optional=True
        ),
    ]
)
