"""The package's layout and its C extensions; everything else is in pyproject.toml.

The source tree keeps each layer in a top-level folder; installed, each is a subpackage
of the one package `tierbroker` (`broker/` becomes `tierbroker.broker`). This mapping is
the only one: wheels, the sdist, editable installs and the Docker image all take it.

- `_walk`: the produce path's record walk. Optional: where it cannot be built,
  `tierbroker.protocol.records.validation` walks records in Python instead (several times
  slower on produce) and logs a warning.
- `_columns`: records as Arrow column buffers, for the Spark source. Optional: where it
  cannot be built (or on big-endian hosts), the source builds its columns from decoded
  records instead.
"""

from setuptools import Extension, find_packages, setup

LAYERS = ("protocol", "storage", "rlm", "broker", "pipeline", "testing")

setup(
    package_dir={"tierbroker": "tierbroker", **{f"tierbroker.{name}": name for name in LAYERS}},
    packages=[
        "tierbroker",
        *(f"tierbroker.{name}" for name in find_packages(include=[f"{n}*" for n in LAYERS])),
    ],
    ext_modules=[
        Extension("tierbroker.protocol.records._walk", ["protocol/records/_walk.c"], optional=True),
        Extension(
            "tierbroker.protocol.records._columns", ["protocol/records/_columns.c"], optional=True
        ),
    ],
)
