"""buildctl.engines.runtime_probe and ``fingerprint --python``: versions come from what the serving
interpreter loads, not from package metadata, and each value says where it came from."""

from __future__ import annotations

import json
import shlex
import sys
from importlib import metadata

import pytest

from buildctl.engines.errors import FingerprintError
from buildctl.engines.fingerprint import detect, runtime_versions


def serving_env(tmp_path):
    """A site directory like a serving container's: pip's metadata says TensorRT 9.3.0.1 (a
    second install), the module Python imports is 9.2.0.5; TensorRT-LLM 1.2.1's version.py."""
    site = tmp_path / "site"
    (site / "tensorrt").mkdir(parents=True)
    (site / "tensorrt" / "__init__.py").write_text('__version__ = "9.2.0.5"\n')
    meta = site / "tensorrt-9.3.0.1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt\nVersion: 9.3.0.1\n")
    (site / "tensorrt_llm").mkdir()
    (site / "tensorrt_llm" / "__init__.py").write_text("raise RuntimeError('importing TensorRT-LLM is not needed')\n")
    (site / "tensorrt_llm" / "version.py").write_text('__version__ = "1.2.1"\n')
    return site


def test_the_serving_interpreter_reports_what_it_loads_not_what_pip_says(tmp_path):
    site = serving_env(tmp_path)
    assert [d.version for d in metadata.distributions(path=[str(site)]) if d.metadata["Name"] == "tensorrt"] == ["9.3.0.1"]
    python = f"env PYTHONPATH={shlex.quote(str(site))} {shlex.quote(sys.executable)} -S"
    got = runtime_versions(python=python)
    assert got["versions"]["tensorrt_version"] == "9.2.0.5"  # the loaded binding, not the dist-info
    assert got["sources"]["tensorrt_version"] == f"tensorrt.__version__ ({site / 'tensorrt' / '__init__.py'})"
    assert got["versions"]["tensorrt_llm_version"] == "1.2.1"  # read from version.py: the package is not imported
    assert str(site / "tensorrt_llm" / "version.py") in got["sources"]["tensorrt_llm_version"]
    assert got["sources"]["python"].startswith(python)


def test_the_cli_fingerprint_takes_the_runtime_from_python(tmp_path, cli):
    site = serving_env(tmp_path)
    python = f"env PYTHONPATH={shlex.quote(str(site))} {shlex.quote(sys.executable)} -S"
    code, out, err = cli("--json", "fingerprint", "--python", python)
    assert code == 0, err
    fp = json.loads(out)
    assert fp["tensorrt_version"] == "9.2.0.5" and fp["tensorrt_llm_version"] == "1.2.1"
    assert fp["torch_version"] is None  # -S: the serving interpreter has no torch, this one does
    assert fp["sources"]["cpu"] == "/proc/cpuinfo" and "NVML" in fp["sources"]["gpus"]


def test_this_interpreters_torch_is_the_one_it_imports():
    import torch

    fp = detect()
    assert fp.torch_version == torch.__version__
    assert fp.sources["torch_version"] == f"torch.__version__ ({torch.__file__.replace('__init__.py', 'version.py')})"
    assert fp.digest() == fp.model_copy(update={"sources": {}}).digest()  # provenance is not identity


@pytest.mark.parametrize("python,why", [("/no/such/python", "could not run it"),
                                        (f"{sys.executable} -c 'import sys; sys.exit(3)'", "the probe did not answer")])
def test_a_probe_that_cannot_run_is_a_fingerprint_error(python, why):
    with pytest.raises(FingerprintError, match=why):
        runtime_versions(python=python)
