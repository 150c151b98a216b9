"""Precisions by compute capability and the explicit TF32 policy: what the plan records is what runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from accelbench_cuda.precision import apply_tf32, make_plan, supported_precisions, tf32_policy
from cuda_standins import a100, install_gpus, v100

from accelbench.contract import World
from accelbench.errors import ConfigError
from accelbench.plugins import PluginHost

ALL = ["fp32", "fp16-mixed", "bf16-mixed", "bf16-true"]


@pytest.fixture(autouse=True)
def restore_tf32_switches() -> Iterator[None]:
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@pytest.mark.parametrize(
    ("capability", "expected"),
    [
        ((5, 0), ["fp32"]),
        ((6, 0), ["fp32", "fp16-mixed"]),  # P100: native half, no tensor cores
        ((7, 0), ["fp32", "fp16-mixed"]),  # V100: fp16 tensor cores, bf16 only emulated
        ((7, 5), ["fp32", "fp16-mixed"]),
        ((8, 0), ALL),
        ((8, 6), ALL),
        ((8, 9), [*ALL, "fp8-tensorwise"]),  # Ada (L4, L40S): FP8 tensor cores; torchao's rowwise needs sm_90
        ((9, 0), [*ALL, "fp8-tensorwise", "fp8-rowwise"]),
        ((10, 0), [*ALL, "fp8-tensorwise", "fp8-rowwise", "mxfp8"]),  # Blackwell: MX tensor cores
        ((12, 0), [*ALL, "fp8-tensorwise", "fp8-rowwise", "mxfp8"]),  # RTX PRO 6000 Blackwell, RTX 50 series
    ],
)
def test_precisions_follow_the_compute_capability(capability: tuple[int, int], expected: list[str]) -> None:
    assert supported_precisions(capability) == expected


def test_tf32_policy_is_off_unless_asked_for() -> None:
    assert tf32_policy({}) is False
    assert tf32_policy({"ACCELBENCH_TF32": "off"}) is False
    assert tf32_policy({"ACCELBENCH_TF32": " ON "}) is True


def test_a_policy_that_is_neither_on_nor_off_is_refused_with_the_choices() -> None:
    with pytest.raises(
        ConfigError, match=r"ACCELBENCH_TF32='yes' is not a TF32 policy: set it to 'on' .* or 'off'"
    ):
        tf32_policy({"ACCELBENCH_TF32": "yes"})


def test_applying_the_policy_sets_both_switches_and_keeps_torch_readable() -> None:
    apply_tf32(True)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.get_float32_matmul_precision() == "high"  # libraries that still ask get an answer
    apply_tf32(False)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"


def test_plans_record_the_math_in_effect() -> None:
    on = make_plan("fp32", (8, 0), tf32=True)
    assert on.matmul_math == "tf32" and "TF32 policy on" in on.notes
    off = make_plan("fp32", (9, 0), tf32=False)
    assert off.matmul_math == "ieee-fp32" and "TF32 policy off" in off.notes
    volta = make_plan("fp32", (7, 0), tf32=True)
    assert volta.matmul_math == "ieee-fp32" and "sm_70 has no TF32" in volta.notes


def test_sixteen_bit_plans_keep_the_standard_meaning_and_say_what_differs() -> None:
    fp16 = make_plan("fp16-mixed", (6, 0), tf32=False)
    assert (fp16.autocast_dtype, fp16.loss_scaling) == ("float16", "dynamic")
    assert "sm_60 has no tensor cores" in fp16.notes
    bf16 = make_plan("bf16-true", (8, 0), tf32=False)
    assert bf16.param_dtype == "bfloat16" and bf16.notes.startswith(
        "parameters, gradients and optimizer state"
    )


def test_the_plan_hook_applies_the_policy_it_records(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [a100(0)])
    monkeypatch.setenv("ACCELBENCH_TF32", "on")
    backend = PluginHost().backends["cuda"]
    device = backend.setup_device(World(local_rank=0), {})
    plan = backend.precision_plan("fp32", device, {})
    assert plan.matmul_math == "tf32" and torch.backends.cuda.matmul.allow_tf32
    monkeypatch.setenv("ACCELBENCH_TF32", "off")
    assert backend.precision_plan("fp32", device, {}).matmul_math == "ieee-fp32"
    assert not torch.backends.cuda.matmul.allow_tf32


def test_the_tf32_run_option_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [a100(0)])
    monkeypatch.setenv("ACCELBENCH_TF32", "off")
    host = PluginHost()
    assert any(o.name == "tf32" and o.backend == "cuda" for o in host.run_options())
    backend = host.backends["cuda"]
    device = backend.setup_device(World(local_rank=0), {})
    assert backend.precision_plan("fp32", device, {"tf32": "on"}).matmul_math == "tf32"
    assert torch.backends.cuda.matmul.allow_tf32
    assert backend.precision_plan("fp32", device, {"tf32": "off"}).matmul_math == "ieee-fp32"
    with pytest.raises(ConfigError, match="'maybe' is not a TF32 policy"):
        backend.precision_plan("fp32", device, {"tf32": "maybe"})


def test_a_volta_gpu_refuses_bf16_naming_what_it_supports(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [v100(0)])
    backend = PluginHost().backends["cuda"]
    device = backend.setup_device(World(local_rank=0), {})
    with pytest.raises(
        ConfigError, match="does not support precision 'bf16-mixed'.*it supports: fp32, fp16-mixed"
    ):
        backend.check_precision("bf16-mixed", device)


def test_before_cuda_starts_precisions_come_from_detection_for_the_weakest_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, cuda = install_gpus(monkeypatch, [a100(0), v100(1)])
    backend = PluginHost().backends["cuda"]
    # the launcher's preflight asks with an index-less device, before any process binds a GPU
    assert backend.supported_precisions(torch.device("cuda")) == ["fp32", "fp16-mixed"]
    assert cuda.current is None, "asking must not bind (and so initialise) a GPU"
    assert backend.supported_precisions(backend.setup_device(World(local_rank=0), {})) == ALL


def test_a_catalogue_gpu_gets_its_plan_from_the_catalogue_with_the_tf32_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`accelbench estimate --device A100` on a host without it: the plan from the catalogue's sm_80 and the run's
    TF32 policy (TF32 tensor math, so the TF32 peak), no torch switch set."""
    from accelbench_cuda.peaks import known_devices, peak_for

    install_gpus(monkeypatch, [])  # no GPU here
    monkeypatch.delenv("ACCELBENCH_TF32", raising=False)
    backend = PluginHost().backends["cuda"]
    by_name = {d.details["aliases"].split(",")[0]: d for d in known_devices()}
    a100_80, volta = by_name["A100"], by_name["V100"]
    apply_tf32(False)
    on = backend.catalogue_precision_plan("fp32", a100_80, {"tf32": "on"})
    assert (
        on.matmul_math == "tf32" and not torch.backends.cuda.matmul.allow_tf32
    )  # nothing runs: no switch set
    assert peak_for(a100_80.name, on).flops_per_s == 156e12  # type: ignore[union-attr]
    assert backend.catalogue_precision_plan("fp32", a100_80, {"tf32": "off"}).matmul_math == "ieee-fp32"
    assert backend.catalogue_precision_plan("fp32", a100_80, {}).matmul_math == "ieee-fp32"
    monkeypatch.setenv("ACCELBENCH_TF32", "on")
    assert backend.catalogue_precision_plan("fp32", a100_80, {}).matmul_math == "tf32"
    assert backend.catalogue_precision_plan("fp32", volta, {"tf32": "on"}).matmul_math == "ieee-fp32"
    with pytest.raises(ConfigError, match="does not run it; it runs: fp32, fp16-mixed"):
        backend.catalogue_precision_plan("bf16-mixed", volta, {})
    with pytest.raises(ConfigError, match="'maybe' is not a TF32 policy"):
        backend.catalogue_precision_plan("fp32", a100_80, {"tf32": "maybe"})
