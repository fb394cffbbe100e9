from __future__ import annotations

import json

import pytest

from buildctl.engines.errors import FingerprintError
from buildctl.engines.fingerprint import CpuInfo, Fingerprint, GpuInfo, detect, host_fingerprint, isa_level, load_fingerprint

from ..support.helpers import settings
from ..support.trtllm_kit import h100x8


def h100_host(**over) -> Fingerprint:
    """An 8xH100 node with TensorRT-LLM 1.2.1's stack (tests/support/fixtures/trtllm/1.2.1/stack.json)."""
    base = dict(
        gpus=(GpuInfo(name="NVIDIA H100 80GB HBM3", sm="9.0", memory_mib=81559),) * 8,
        driver_version="580.95.05", cuda_version="13.1", tensorrt_version="10.13.3",
        tensorrt_llm_version="1.2.1", torch_version="2.9.0",
        cpu=CpuInfo(machine="x86_64", isa_level="x86-64-v4", flags=("avx2", "avx512f")),
        platform="linux-x86_64", glibc_version="2.35", compiler_version="gcc 11.4.0",
    )
    base.update(over)
    return Fingerprint(**base)


def test_detect_without_gpu():
    fp = detect()
    assert fp.gpus == () or all(g.sm for g in fp.gpus)
    assert fp.platform.startswith("linux-")
    assert fp.compat_key("aoti").startswith("aoti-")
    assert fp.compat_key("trtllm").startswith("trtllm-")
    # deterministic
    assert detect().digest() == fp.digest()


def test_roundtrip_through_json(tmp_path):
    fp = h100_host()
    f = tmp_path / "fp.json"
    f.write_text(json.dumps(fp.model_dump(mode="json")))
    assert load_fingerprint(f) == fp
    assert load_fingerprint(f).digest() == fp.digest()
    assert fp.gpu_count == 8


@pytest.mark.parametrize("change", [
    {"gpus": (GpuInfo(name="NVIDIA L40S", sm="8.9", memory_mib=46068),)},  # another SM
    {"tensorrt_version": "10.14.1"},
    {"tensorrt_llm_version": "1.2.0"},
    {"cuda_version": "12.9"},  # another CUDA major
    {"platform": "linux-aarch64"},
])
def test_trtllm_key_changes_on_hard_fields(change):
    assert h100_host(**change).compat_key("trtllm") != h100_host().compat_key("trtllm")


@pytest.mark.parametrize("change", [
    {"driver_version": "590.44.01"},  # another branch: soft, a re-check
    {"driver_version": "580.105.08"},  # same branch
    {"cuda_version": "13.0"},  # same major: soft
    {"gpus": (GpuInfo(name="NVIDIA H200", sm="9.0", memory_mib=143771),) * 8},  # another model, the same SM: soft
    {"torch_version": "2.9.1"},
    {"compiler_version": "gcc 13.1.0"},
    {"glibc_version": "2.39"},
])
def test_trtllm_key_ignores_soft_and_other_fields(change):
    assert h100_host(**change).compat_key("trtllm") == h100_host().compat_key("trtllm")


@pytest.mark.parametrize("change,soft", [
    ({"driver_version": "590.44.01"}, {"driver_version"}),
    ({"cuda_version": "13.0"}, {"cuda_version"}),
    ({"gpus": (GpuInfo(name="NVIDIA H200", sm="9.0", memory_mib=143771),) * 8}, {"gpus.name"}),
    ({"torch_version": "2.9.1"}, set()),
])
def test_trtllm_soft_differences_name_the_changed_soft_fields(change, soft):
    assert set(h100_host().soft_differences(h100_host(**change), "trtllm")) == soft


@pytest.mark.parametrize("change", [
    {"torch_version": "2.10.0"},
    {"platform": "linux-aarch64"},
    {"cpu": CpuInfo(machine="x86_64", isa_level="x86-64-v3", flags=("avx2",))},
])
def test_aoti_key_changes_on_hard_fields(change):
    assert h100_host(**change).compat_key("aoti") != h100_host().compat_key("aoti")


@pytest.mark.parametrize("change", [
    {"driver_version": "590.44.01"}, {"tensorrt_version": "10.14.1"},
    {"compiler_version": "gcc 13.1.0"},  # the node's compiler: soft (its C++ runtime), not hard
    {"compiler_version": "gcc 11.5.0"}, {"gpus": ()}, {"glibc_version": "2.39"},
    {"cpu": CpuInfo(machine="x86_64", isa_level="x86-64-v4", flags=("avx2", "avx512f", "amx_tile"))},
])
def test_aoti_key_ignores_soft_and_other_fields(change):
    assert h100_host(**change).compat_key("aoti") == h100_host().compat_key("aoti")


def test_compat_differences_names_fields():
    diff = h100_host().compat_differences(h100_host(tensorrt_version="10.14.1"), "trtllm")
    assert diff == {"tensorrt_version": ("10.13.3", "10.14.1")}


def test_new_keys_never_equal_schema_1_keys_and_schema_1_keys_are_reproduced():
    """The schema-1 key of tests/support/fixtures/legacy_store's hosts, as the code of commit
    3565518 computed them, and a new key that differs from it."""
    from ..support.helpers import REPO

    fixture = json.loads((REPO / "tests/support/fixtures/legacy_store/FINGERPRINTS.json").read_text())
    for host, backend in (("cpu", "aoti"), ("h100", "trtllm"), ("l40s", "trtllm")):
        fp = Fingerprint.model_validate(fixture[host])
        assert fp.legacy_compat_key(backend) == fixture["keys"][host]
        assert fp.compat_key(backend) != fixture["keys"][host]


def test_a_new_key_differs_from_a_schema_1_key_even_over_the_same_fields():
    from buildctl.engines.compat import compat_key_of, legacy_compat_key

    fields = {"tensorrt": "10.13.3", "platform": "linux-x86_64"}
    assert compat_key_of("trtllm", fields) != legacy_compat_key("trtllm", fields)


def test_driver_floor_follows_the_cuda_major():
    assert h100_host().floor_problems("trtllm") == []  # 580.95 runs CUDA 13
    low = h100_host(driver_version="575.57.08")
    assert low.floor_problems("trtllm") == ["driver >= the CUDA runtime's minimum: CUDA 13 needs driver >= 580.0.0: "
                                            "this host has 575.57.08"]
    assert h100_host(driver_version="575.57.08", cuda_version="12.9").floor_problems("trtllm") == []
    assert h100_host(gpus=()).floor_problems("trtllm") == []  # no GPU: nothing to run it on, no floor to meet
    assert h100_host(gpus=(), driver_version=None).floor_problems("trtllm") == []  # a CPU host with CUDA libraries
    assert h100_host(gpus=(), driver_version="470.1.1").floor_problems("trtllm") == []


def test_the_driver_floor_of_each_cuda_major_is_exact():
    """Each CUDA major's minimum driver (NVIDIA's table) passes exactly at the minimum and fails one
    step below it; a host that reports no driver is named."""
    for cuda, low, minimum in (("11.8", "450.80.01", "450.80.02"), ("12.4", "525.60.12", "525.60.13"),
                               ("13.0", "579.999.999", "580.0.0")):
        assert h100_host(cuda_version=cuda, driver_version=minimum).floor_problems("trtllm") == [], cuda
        assert h100_host(cuda_version=cuda, driver_version=low).floor_problems("trtllm") == [
            f"driver >= the CUDA runtime's minimum: CUDA {cuda.split('.')[0]} needs driver >= "
            f"{'.'.join(str(int(x)) for x in minimum.split('.'))}: this host has {low}"], cuda
    assert h100_host(driver_version=None).floor_problems("trtllm") == [
        "driver >= the CUDA runtime's minimum: CUDA 13 needs driver >= 580.0.0: this host reports none"]
    assert h100_host(cuda_version="10.2", driver_version="1.0").floor_problems("trtllm") == []  # no table row: no floor


def test_glibc_floor_is_the_build_hosts():
    built = h100_host(glibc_version="2.39").model_dump(mode="json")
    assert h100_host(glibc_version="2.35").floor_problems("aoti", built) == [
        "glibc >= the build host's: built against glibc 2.39: this host has 2.35"]
    assert h100_host(glibc_version="2.39").floor_problems("aoti", built) == []
    assert h100_host(glibc_version="2.35").floor_problems("aoti") == []


def test_fingerprint_json_with_backends_loads_back(tmp_path):
    fp = h100_host()
    data = {**fp.model_dump(mode="json"), "backends": fp.backends_json()}
    trt = data["backends"]["trtllm"]
    assert trt["hard"] == ["gpus.sm", "tensorrt_version", "tensorrt_llm_version", "cuda_version", "platform"]
    assert trt["soft"] == ["gpus.name", "driver_version", "cuda_version"]
    assert trt["floors"] == ["driver_version", "cuda_version"] and trt["compat_key"] == fp.compat_key("trtllm")
    assert data["backends"]["aoti"]["hard"] == ["cpu.isa_level", "torch_version", "platform"]
    assert all(f["source"] for b in data["backends"].values() for f in b["fields"])
    f = tmp_path / "fp.json"
    f.write_text(json.dumps(data))
    assert load_fingerprint(f) == fp


@pytest.mark.parametrize("flags,level", [
    ({"sse4_2", "popcnt"}, "x86-64-v2"),
    ({"sse4_2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"}, "x86-64-v3"),
    ({"sse4_2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe",
      "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}, "x86-64-v4"),
    (set(), "x86-64-v1"),
])
def test_isa_level(flags, level):
    assert isa_level("x86_64", flags) == level
    assert isa_level("aarch64", flags) == "aarch64"


def test_bad_fingerprint_file(tmp_path):
    f = tmp_path / "fp.json"
    f.write_text('{"gpus": 3}')
    with pytest.raises(FingerprintError) as exc:
        load_fingerprint(f)
    assert exc.value.source == str(f)
    with pytest.raises(FingerprintError):
        load_fingerprint(tmp_path / "missing.json")


def test_env_override(tmp_path, monkeypatch):
    f = tmp_path / "fp.json"
    f.write_text(json.dumps(h100_host().model_dump(mode="json")))
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(f))
    assert host_fingerprint(settings()) == h100_host()


# --- compat keys: one field at a time (guard: kills a mutant the suite once let through, #20) ---


# (field, new value, changes the trtllm key, changes the aoti key)
ONE_AT_A_TIME = (
    ("driver_version", "{major5}.10", False, False),  # a new driver branch: soft for trtllm
    ("driver_version", "{major}.99", False, False),  # a patch within the branch
    ("cuda_version", "99.0", True, False),  # a new CUDA major
    ("cuda_version", "{cuda_major}.99", False, False),  # a new CUDA minor: soft
    ("tensorrt_version", "99.1.0", True, False),
    ("tensorrt_llm_version", "9.9.9", True, False),
    ("torch_version", "0.0.1", False, True),
    ("compiler_version", "gcc 99.1.0", False, False),  # soft for aoti
    ("platform", "linux-riscv64", True, True),
    ("glibc_version", "9.99", False, False),
)


@pytest.mark.guard
def test_compat_keys_change_with_each_hard_field_and_only_those():
    fp = h100x8().model_copy(update={"torch_version": "2.9.0", "compiler_version": "gcc 12.2.0"})
    major = fp.driver_version.split(".")[0]
    subs = {"major5": str(int(major) + 5), "major": major, "cuda_major": fp.cuda_version.split(".")[0]}
    for field, value, trt, aoti in ONE_AT_A_TIME:
        changed = fp.model_copy(update={field: value.format(**subs)})
        assert (changed.compat_key("trtllm") != fp.compat_key("trtllm")) is trt, (field, value)
        assert (changed.compat_key("aoti") != fp.compat_key("aoti")) is aoti, (field, value)
    cpu = fp.model_copy(update={"cpu": fp.cpu.model_copy(update={"isa_level": "x86-64-v2"})})
    assert cpu.compat_key("aoti") != fp.compat_key("aoti") and cpu.compat_key("trtllm") == fp.compat_key("trtllm")
    gpus = fp.model_copy(update={"gpus": tuple(g.model_copy(update={"sm": "8.9"}) for g in fp.gpus)})
    assert gpus.compat_key("trtllm") != fp.compat_key("trtllm") and gpus.compat_key("aoti") == fp.compat_key("aoti")


def test_fingerprint_set_writes_an_upgraded_hosts_file_and_names_a_wrong_field(cli, tmp_path):
    """#50 item 6: `fingerprint --json --set FIELD=VALUE` prints the fingerprint as after an upgrade,
    loadable as a fingerprint file; a field a fingerprint does not have names itself (exit 2)."""
    import json

    from buildctl.engines.fingerprint import detect, load_fingerprint

    code, out, err = cli("--json", "fingerprint", "--set", "compiler_version=g++ 99.1", "--set", "cpu.isa_level=x86-64-v2")
    assert code == 0, err
    (tmp_path / "after.json").write_text(out)
    after = load_fingerprint(tmp_path / "after.json")
    assert after.compiler_version == "g++ 99.1" and after.cpu.isa_level == "x86-64-v2"
    assert after.compat_key("aoti") != detect().compat_key("aoti")  # a hard field of aoti changed
    assert json.loads(out)["backends"]["aoti"]["compat_key"] == after.compat_key("aoti")
    for bad, named in (("driver_verison=1", "driver_verison: not a fingerprint field"), ("platform", "not FIELD=VALUE")):
        code, _, err = cli("fingerprint", "--set", bad)
        assert code == 2 and named in err, err
