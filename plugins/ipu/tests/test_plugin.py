"""The plugin in accelbench: loading, detection (with and without poptorch), the backend's methods, peak tables,
and whole runs through the core's runner and command line against the stand-in."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelbench_ipu import detect
from accelbench_ipu.peaks import IN_PROCESSOR_MEMORY_MK2
from accelbench_ipu.plugin import IpuBackend
from accelbench_ipu.precision import ipu_precision_plan
from ipu_helpers import FAKE_POPTORCH, REAL_POPTORCH, ipu_config, stand_in_only

from accelbench.cli import build_parser, config_from_args
from accelbench.contract import NO_COLLECTIVE, DeviceInfo, World
from accelbench.errors import ConfigError
from accelbench.plugins import PluginHost

M2000_INFO = """Device Info:
  id: 0
  target: Fabric
  board type: M2000
  board variant: M2000
  clock: 1330MHz
  driver version: 1.0.57
  firmware version: 2.6.5
  ipu architecture: ipu2
"""

backend = IpuBackend()  # as the host makes it (one instance per process)


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accelbench.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def env_without_poptorch() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "POPTORCH_IPU_MODEL")}
    env["ACCELBENCH_PLUGINS"] = "cpu,ipu"
    return env


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> PluginHost:
    """This plugin and the CPU backend only: other plugins (installed or being edited) cannot interfere."""
    monkeypatch.setenv("ACCELBENCH_PLUGINS", "cpu,ipu")
    return PluginHost(strict=True)


# loading ------------------------------------------------------------------------------------------------


def test_the_plugin_registers_the_ipu_backend(host: PluginHost) -> None:
    record = next(r for r in host.records if r.name == "ipu")
    assert (record.status, record.contract, record.distribution) == ("active", "3.0", "accelbench-ipu")
    backend = host.backends["ipu"]
    assert isinstance(backend, IpuBackend)
    assert backend.info.device_type == "ipu" and backend.info.device_unit == "IPU"
    ipu = torch.device("ipu")
    strategies = ["single", "pipelined", "sharded", "serial-phased", "parallel-phased"]
    assert backend.supported_strategies(ipu) == strategies and list(backend.strategies) == strategies
    assert backend.supported_precisions(ipu) == ["fp32", "fp16-mixed"]
    # no torch.distributed: replication is PopTorch's
    assert backend.collective_backend(ipu) is NO_COLLECTIVE and backend.collective(ipu) is None
    assert backend.setup_device(World(local_rank=0), {}) == torch.device("cpu")  # PopTorch takes host tensors
    assert backend.compile_backend() is None and backend.lightning_accelerator() is None


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        # PopTorch compiles the graph itself, and torch.compile cannot target IPUs
        (["--compile"], "cannot compile"),
        (["--engine", "lightning"], "names no Lightning accelerator"),  # Lightning dropped IPU support
        # PopTorch recomputes by its own options, which --activation-checkpointing is not mapped to
        (["--activation-checkpointing"], "not mapped to PopTorch's recomputation"),
    ],
)
def test_what_ipus_cannot_do_is_refused_up_front(host: PluginHost, args: list[str], refusal: str) -> None:
    from accelbench.engine.runner import preflight

    parsed = build_parser(host.run_options()).parse_args(["run", "--backend", "ipu", *args])
    with pytest.raises(ConfigError, match=refusal):
        preflight(config_from_args(parsed), host)


def test_run_options_reach_the_config(host: PluginHost) -> None:
    args = build_parser(host.run_options()).parse_args(
        ["run", "--backend", "ipu", "--strategy", "pipelined", "--devices", "8", "--ipus", "4", "--replicas", "2",
         "--layers-per-ipu", "0,4,4,4", "--stochastic-rounding", "--executable-cache", "/tmp/c"]
    )  # fmt: skip
    config = config_from_args(args)
    options = config.backend_options
    assert (options["ipus"], options["replicas"], options["layers_per_ipu"]) == (4, 2, "0,4,4,4")
    assert options["stochastic_rounding"] is True and options["executable_cache"] == "/tmp/c"
    assert "partials" not in options  # not given: the plugin applies its default and records it


@stand_in_only  # with the SDK installed, poptorch cannot be hidden from a subprocess
def test_without_poptorch_it_loads_detects_nothing_and_says_why() -> None:
    env = env_without_poptorch()
    listing = cli("plugins", "--json", env=env)
    assert listing.returncode == 0, listing.stderr
    ipu = next(p for p in json.loads(listing.stdout) if p["name"] == "ipu")
    assert ipu["status"] == "active" and ipu["devices"] == []
    assert "Poplar SDK" in ipu["backend"]["description"]
    refused = cli("run", "--backend", "ipu", "--quiet", env=env)
    assert refused.returncode == 2
    assert "found no device" in refused.stderr


# detection ----------------------------------------------------------------------------------------------


@stand_in_only
def test_detection_counts_ipus_through_poptorch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_POPTORCH_IPUS", "4")
    devices = backend.detect_devices()
    assert len(devices) == 4 and devices[0].arch == "ipu2"
    assert devices[0].memory_bytes == IN_PROCESSOR_MEMORY_MK2
    assert devices[0].name.startswith("Graphcore Mk2 IPU")  # no gc-info: GC200 or Bow cannot be told apart
    assert devices[0].details["part"] == "" and "stand-in" in devices[0].details["stand_in"]
    assert backend.runtime_versions()["poptorch"].endswith("(test stand-in, not Graphcore's)")


@stand_in_only
def test_detection_reads_the_board_from_gc_info(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tool = tmp_path / "gc-info"
    tool.write_text(f"#!/bin/sh\ncat <<'EOF'\n{M2000_INFO}EOF\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    devices = backend.detect_devices()
    assert len(devices) == 16 and devices[0].name == "Graphcore GC200 IPU (Mk2)"
    assert devices[0].details["board_type"] == "M2000" and devices[0].details["part"] == "gc200"
    peak = backend.peak_figures(devices[0], ipu_precision_plan("fp16-mixed", partials="half"))
    assert peak is not None and peak.flops_per_s == 250e12
    assert backend.runtime_versions()["ipu_driver_version"] == "1.0.57"


@stand_in_only
def test_no_ipus_no_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_POPTORCH_IPUS", "0")
    assert backend.detect_devices() == []


def test_the_ipu_model_is_detected_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POPTORCH_IPU_MODEL", "1")
    devices = backend.detect_devices()
    assert devices and devices[0].name == "IPU Model (emulator)" and devices[0].details["emulated"] == "true"
    assert backend.peak_figures(devices[0], ipu_precision_plan("fp32")) is None


def test_without_poptorch_detection_is_empty_and_cheap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(
        detect.subprocess, "run", lambda *a, **k: pytest.fail("no subprocess without poptorch")
    )
    assert backend.detect_devices() == []
    assert "Poplar SDK" in backend.runtime_versions()["poptorch"]


@pytest.mark.parametrize(
    ("board", "version", "part"),
    [
        ({"board type": "M2000"}, 2, "gc200"),
        ({"board type": "BOW-2000", "ipu architecture": "ipu2"}, 2, "bow"),
        ({"board type": "C600", "ipu architecture": "ipu21"}, 21, "c600"),
        ({"ipu architecture": "ipu2", "clock": "1850MHz"}, 2, "bow"),
        ({"ipu architecture": "ipu2", "clock": "20MHz"}, 2, ""),  # an idle clock tells nothing
        ({}, 2, ""),
    ],
)
def test_classify_boards(board: dict[str, str], version: int, part: str) -> None:
    assert detect.classify(version, board)[0] == part


def test_gc_info_parsing() -> None:
    parsed = detect.parse_gc_info(M2000_INFO)
    assert parsed["board type"] == "M2000" and parsed["clock"] == "1330MHz" and "id" in parsed


# precision and peaks ------------------------------------------------------------------------------------


def test_precision_plans_say_what_the_amps_compute() -> None:
    fp32 = backend.precision_plan("fp32", torch.device("cpu"), {})
    assert fp32.param_dtype == "float32" and fp32.matmul_math.startswith("FP32.32")
    fp16 = backend.precision_plan("fp16-mixed", torch.device("cpu"), {})
    assert fp16.param_dtype == "float16" and fp16.matmul_math.startswith(
        "FP16.32"
    )  # PopTorch's float partials
    assert "model.half()" in fp16.notes and "stochastic rounding off" in fp16.notes


def test_precision_plans_follow_the_runs_precision_options() -> None:
    options = {"partials": "half", "stochastic_rounding": True, "ipu_loss_scaling": 128.0}
    plan = backend.precision_plan("fp16-mixed", torch.device("cpu"), options)
    assert plan == ipu_precision_plan("fp16-mixed", "half", True, 128.0)
    assert plan.matmul_math.startswith("FP16.16") and "stochastic rounding on" in plan.notes
    with pytest.raises(ConfigError, match="--partials half applies to fp16 matmuls"):
        backend.precision_plan("fp32", torch.device("cpu"), {"partials": "half"})


@pytest.mark.parametrize(
    ("part", "precision", "partials", "flops"),
    [
        ("gc200", "fp32", "float", 62.5e12),
        ("gc200", "fp16-mixed", "half", 250e12),
        ("bow", "fp16-mixed", "half", 350e12),
        ("bow", "fp32", "float", 87.5e12),
        ("gc200", "fp16-mixed", "float", None),  # no published FP16.32 figure: unknown, not guessed
        ("", "fp32", "float", None),
    ],
)
def test_peak_tables(part: str, precision: str, partials: str, flops: float | None) -> None:
    device = DeviceInfo(index=0, name="x", details={"part": part})
    peak = backend.peak_figures(device, ipu_precision_plan(precision, partials))
    assert (peak.flops_per_s if peak else None) == flops
    if peak:
        assert peak.memory_bandwidth_bytes_per_s and "vendor table" in peak.source


def test_timing_and_memory_without_torch_accelerator() -> None:
    cpu = torch.device("cpu")
    assert backend.synchronize(cpu) is None and backend.epoch_start(cpu) is None
    stats = backend.epoch_end(cpu).memory
    assert stats.peak_bytes is None and "not compiled yet" in stats.source


# whole runs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("strategy", "devices", "batch"), [("single", 1, 8), ("pipelined", 2, 5)])
def test_a_run_through_the_runner_writes_an_honest_record(
    strategy: str, devices: int, batch: int, tmp_path: Path, host: PluginHost
) -> None:
    from accelbench.engine.runner import run

    config = ipu_config(strategy=strategy, devices=devices, batch_size=batch, epochs=2, output_dir=tmp_path)
    record, path, status = run(config, host)
    assert status == "ok", record.outcome if record else None
    assert record is not None and path is not None and path.exists()
    assert record.backend.info.device_unit == "IPU" and record.backend.devices_used == devices
    assert record.executor["strategy"] == strategy and record.executor["ipus_per_replica"] == devices
    assert record.executor["emulated"] is True and "not IPU" in record.executor["timing"]
    assert record.precision is not None and record.precision.matmul_math.startswith("FP32.32")
    metrics = record.metrics
    assert metrics is not None and metrics.compile_s is not None and metrics.compile_s > 0
    assert len(metrics.epochs) == 2 and metrics.warmup is not None and metrics.steady is not None
    assert metrics.peak is None and metrics.steady.mfu is None  # no known part, no table peak: MFU unknown


@pytest.mark.slow
def test_the_command_line_runs_a_pipeline_over_four_ipus(tmp_path: Path) -> None:
    env = dict(os.environ)
    if not REAL_POPTORCH:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKE_POPTORCH), env.get("PYTHONPATH")]))
    env["ACCELBENCH_PLUGINS"] = "cpu,ipu"
    done = cli(
        "run", "--backend", "ipu", "--strategy", "pipelined", "--devices", "4", "--ipus", "4",
        "--model", "custom", "--layers", "4", "--heads", "2", "--embd", "16", "--block-size", "16",
        "--batch-size", "9", "--steps-per-epoch", "1", "--dropout", "0", "--quiet", "--json",
        "--output-dir", str(tmp_path), env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    executor = record["executor"]
    assert executor["gradient_accumulation"] == 9 and executor["micro_batch"] == 1
    assert [s["ipu"] for s in executor["layout"]["stages"]] == [0, 1, 2, 3, 0]
    assert record["config"]["backend_options"]["ipus"] == 4
    refused = cli("run", "--backend", "ipu", "--strategy", "pipelined", "--ipus", "4", "--quiet", env=env)
    assert refused.returncode == 2 and "pass --devices 4" in refused.stderr


def test_ipu_peaks_by_math_have_no_fp8_and_are_versioned() -> None:
    from accelbench_ipu.peaks import TABLE_VERSION, known_devices, peaks_by_math

    gc200, bow = known_devices()
    assert peaks_by_math(gc200) == {"fp16": 250e12, "fp32": 62.5e12}
    assert peaks_by_math(bow) == {"fp16": 350e12, "fp32": 87.5e12}
    assert peaks_by_math(DeviceInfo(index=0, name="Graphcore C600", details={"part": "c600"})) == {}
    peak = backend.peak_figures(gc200, ipu_precision_plan("fp16-mixed", partials="half"))
    assert peak is not None and peak.table_version == TABLE_VERSION
