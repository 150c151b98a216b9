"""Run options: the replica/IPU layout against --devices, powers of two, batch arithmetic, gradient
accumulation for pipelines, the emulator's limits; every refusal says what would work."""

from __future__ import annotations

import pytest
from accelbench_ipu.settings import run_options, settings_from_config
from ipu_helpers import ipu_config

from accelbench.errors import ConfigError
from accelbench.workloads import ModelUnits
from accelbench.workloads.gpt import GPTWorkload


def settings(**fields: object):  # type: ignore[no-untyped-def]
    config = ipu_config(**fields)
    return settings_from_config(config, GPTWorkload().units(config))


def test_layout_from_devices_and_replicas() -> None:
    s = settings(strategy="pipelined", devices=8, batch_size=72, backend_options={"replicas": 2})
    assert (s.ipus, s.replicas, s.total_ipus) == (4, 2, 8)
    # 4 IPUs -> 5 stages -> gradient accumulation >= 9; 72 = micro-batch 4 x 2 replicas x 9
    assert s.gradient_accumulation == 9 and s.micro_batch == 4
    assert "2 x 5 - 1 = 9" in s.gradient_accumulation_source


def test_ipus_must_agree_with_devices() -> None:
    s = settings(strategy="pipelined", devices=4, batch_size=9, backend_options={"ipus": 4})
    assert s.ipus == 4
    with pytest.raises(
        ConfigError, match=r"--ipus 4 x --replicas 1 = 4 IPUs, but --devices is 1.*pass --devices 4"
    ):
        settings(strategy="pipelined", batch_size=9, backend_options={"ipus": 4})
    with pytest.raises(ConfigError, match="--devices 6 is not a multiple of --replicas 4"):
        settings(devices=6, backend_options={"replicas": 4})


def test_ipus_come_in_powers_of_two_unless_rounded() -> None:
    with pytest.raises(
        ConfigError, match=r"= 3 IPUs, but IPUs are reserved in powers of two: use 2 or 4 IPUs"
    ):
        settings(strategy="sharded", devices=3)
    s = settings(strategy="sharded", devices=3, backend_options={"auto_round_ipus": True})
    assert s.total_ipus == 3 and s.reserved_ipus == 4
    with pytest.raises(ConfigError, match="at most 64"):
        settings(strategy="sharded", devices=128)


def test_pipelined_gradient_accumulation_is_chosen_or_checked() -> None:
    # batch 64 over 4 IPUs (5 stages): the smallest accumulation >= 9 that divides 64 is 16
    s = settings(strategy="pipelined", devices=4, batch_size=64)
    assert s.gradient_accumulation == 16 and s.micro_batch == 4
    with pytest.raises(
        ConfigError, match=r"needs gradient accumulation >= 2 x 5 - 1 = 9; use --gradient-accumulation 16"
    ):
        settings(strategy="pipelined", devices=4, batch_size=64, backend_options={"gradient_accumulation": 4})
    with pytest.raises(ConfigError, match=r"2 x 5 - 1 = 9.*multiples of 9, e.g. 9"):
        settings(strategy="pipelined", devices=4, batch_size=8)
    # sharded and phased need no accumulation: the default is 1
    assert settings(strategy="sharded", devices=4, batch_size=8).gradient_accumulation == 1


def test_batch_must_be_a_multiple_of_iterations_replicas_accumulation() -> None:
    s = settings(
        devices=2,
        batch_size=24,
        backend_options={"replicas": 2, "device_iterations": 3, "gradient_accumulation": 2},
    )
    assert s.micro_batch == 2 and s.samples_per_optimizer_step == 8
    with pytest.raises(ConfigError) as info:
        settings(
            devices=2,
            batch_size=20,
            backend_options={"replicas": 2, "device_iterations": 3, "gradient_accumulation": 2},
        )
    text = str(info.value)
    assert (
        "--batch-size 20 is not a multiple of device iterations 3 x replicas 2 x gradient accumulation 2 = 12"
        in text
    )
    assert "Invalid batch dimension" in text and "e.g. 12 or 24" in text


def test_emulator_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="emulator has no replication"):
        settings(devices=2, backend_options={"replicas": 2, "ipu_model": True})
    with pytest.raises(ConfigError, match="no executable cache"):
        settings(backend_options={"ipu_model": True, "executable_cache": "/tmp/x"})
    monkeypatch.setenv("POPTORCH_IPU_MODEL", "1")  # PopTorch's own switch counts as asking for the emulator
    assert settings().emulated


def test_precision_options() -> None:
    s = settings(precision="fp16-mixed", backend_options={"partials": "half", "stochastic_rounding": True})
    assert (s.partials, s.stochastic_rounding) == ("half", True)
    with pytest.raises(ConfigError, match="--partials half applies to fp16 matmuls"):
        settings(backend_options={"partials": "half"})
    with pytest.raises(ConfigError, match="choose float"):
        settings(precision="fp16-mixed", backend_options={"partials": "double"})
    with pytest.raises(ConfigError, match="must be positive"):
        settings(backend_options={"ipu_loss_scaling": 0})


def test_other_refusals() -> None:
    with pytest.raises(ConfigError, match="multi-host IPU-PODs need Graphcore's poprun"):
        settings(nnodes=2)
    # any workload's model maps to IPUs through its parts; one without a stem and a head to put on IPU 0 cannot
    headless = ModelUnits(stem=(), units=("blocks.0",), head=())
    with pytest.raises(ConfigError, match="needs a stem \\(embedding\\) and a head"):
        settings_from_config(ipu_config(), headless)
    with pytest.raises(ConfigError, match="--replicas 'two': a whole number"):
        settings(backend_options={"replicas": "two"})
    with pytest.raises(ConfigError, match="--device-iterations 0: must be at least 1"):
        settings(backend_options={"device_iterations": 0})
    with pytest.raises(ConfigError, match="gpt-nano has 3 transformer layers"):
        settings(
            model="gpt-nano",
            n_layer=None,
            n_head=None,
            n_embd=None,
            strategy="pipelined",
            devices=8,
            batch_size=16,
        )


def test_run_options_are_declared_for_the_ipu_backend() -> None:
    options = {o.cli_flag: o for o in run_options()}  # by the flag users type (the key is its _ spelling)
    assert {
        "ipus",
        "replicas",
        "device-iterations",
        "gradient-accumulation",
        "layers-per-ipu",
        "partials",
    } <= set(options)
    assert {"stochastic-rounding", "executable-cache", "ipu-model", "auto-round-ipus"} <= set(options)
    assert all(o.backend == "ipu" for o in options.values())
    assert options["stochastic-rounding"].type == "bool" and options["replicas"].default == 1
