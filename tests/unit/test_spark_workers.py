"""Which interpreter a local Spark session's Python workers get, and `export` without Spark."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tierbroker.pipeline import SPARK_INSTALL
from tierbroker.pipeline.jobs import export
from tierbroker.pipeline.spark import SPARK_DEFAULT_PYTHON, local_worker_python


def test_without_pyspark_python_the_workers_run_this_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert local_worker_python(SPARK_DEFAULT_PYTHON) == sys.executable


def test_a_pyspark_python_that_imports_the_source_is_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    python = tmp_path / "python"  # another path to an interpreter that has everything
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("PYSPARK_PYTHON", str(python))
    assert local_worker_python(str(python)) == str(python)
    monkeypatch.setenv("PYSPARK_PYTHON", SPARK_DEFAULT_PYTHON)  # set explicitly: checked too
    monkeypatch.setenv("PATH", str(tmp_path))
    (tmp_path / SPARK_DEFAULT_PYTHON).symlink_to(python)
    assert local_worker_python(SPARK_DEFAULT_PYTHON) == SPARK_DEFAULT_PYTHON


@pytest.mark.parametrize("kind", ["no site-packages", "no such file"])
def test_a_pyspark_python_that_cannot_import_the_source_fails_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str
) -> None:
    python = tmp_path / "python"
    if kind == "no site-packages":  # starts, but finds neither pyarrow nor tierbroker
        python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
        python.chmod(0o755)
    monkeypatch.setenv("PYSPARK_PYTHON", str(python))
    with pytest.raises(RuntimeError) as failed:
        local_worker_python(str(python))
    message = str(failed.value)
    assert "\n" not in message and str(python) in message
    assert f"set PYSPARK_PYTHON={sys.executable} or unset it" in message


def test_export_without_pyspark_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    real = export.importlib.util.find_spec
    monkeypatch.setattr(
        export.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pyspark" else real(name, *a),
    )
    args = ["--storage", tmp_path.as_uri(), "--topic", "t", "--to", str(tmp_path / "out")]
    assert export.main(args) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"tierbroker export needs PySpark: {SPARK_INSTALL}\n"


def test_importing_the_source_without_pyarrow_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m.startswith("tierbroker.pipeline.spark")]:
        monkeypatch.delitem(sys.modules, name)  # restored afterwards
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # None: the import fails
    with pytest.raises(ModuleNotFoundError) as failed:
        import tierbroker.pipeline.spark  # noqa: F401
    assert str(failed.value) == (f"tierbroker.pipeline.spark needs pyarrow: {SPARK_INSTALL}")


def test_export_refuses_a_storage_that_does_not_work_and_a_topic_it_does_not_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = (tmp_path / "missing").as_uri()
    args = ["--topic", "t", "--to", str(tmp_path / "out")]
    assert export.main(["--storage", missing, *args]) == 2
    assert (
        capsys.readouterr().err == f"error: {missing}: {tmp_path / 'missing'} is not a directory\n"
    )
    empty = tmp_path.as_uri()
    assert export.main(["--storage", empty, *args]) == 1
    assert capsys.readouterr().err == f"error: no remote segments of topic t in {empty}\n"
