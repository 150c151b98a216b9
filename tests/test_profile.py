"""`run --profile`: where a step's time goes, split as seed 001 splits it, from torch.profiler's events.

The split is checked on hand-built event trees (every category and both the host-only and the accelerator path,
with the expected seconds worked out in the test) and on real profiled runs: one process, and two over gloo.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from core_support import TINY, accelbench

from accelbench.engine.profile import CATEGORIES, analyse_step
from accelbench.engine.runner import run
from accelbench.plugins import get_host
from accelbench.results import read_record
from accelbench.testing import tiny_config


@dataclass
class Span:
    start: float
    end: float


@dataclass
class Ev:
    """A profiler event as the analysis reads it (FunctionEvent's fields), times in microseconds."""

    name: str
    start: float
    end: float
    children: list[Ev] = field(default_factory=list)
    thread: int = 1
    is_user_annotation: bool = False
    overload_name: str = ""

    @property
    def cpu_children(self) -> list[Ev]:
        return self.children

    @property
    def time_range(self) -> Span:
        return Span(self.start, self.end)


def step_tree() -> Ev:
    return Ev("ProfilerStep#3", 0, 100, [
        Ev("accelbench::data", 0, 5, [Ev("aten::copy_", 1, 4)], is_user_annotation=True),
        Ev("aten::linear", 10, 40, [  # composite: its own time is dispatch
            Ev("aten::addmm", 12, 38, [Ev("aten::copy_", 13, 15)]),  # computes: own time is a kernel
        ]),
        Ev("aten::view", 41, 42),  # metadata only: dispatch
        Ev("autograd::engine::evaluate_function: AddmmBackward0", 43, 48, [Ev("aten::mm", 44, 47)]),
        Ev("Optimizer.step#AdamW.step", 50, 70, [Ev("aten::_fused_adamw_", 51, 69)]),
        Ev("c10d::allreduce_", 72, 80),
    ])  # fmt: skip


def test_a_host_step_is_split_into_categories_that_sum_to_it() -> None:
    a = analyse_step(step_tree())
    us = {k: round(v * 1e6, 6) for k, v in a.seconds.items()}
    assert us == {
        "data": 5.0,
        "optimizer": 20.0,
        "communication": 8.0,
        "kernel": 24.0 + 2.0 + 3.0,  # addmm's own time, its copy, the backward's mm
        "intra-op dispatch": 4.0 + 1.0 + 2.0,  # linear's own time, the view, the autograd node's own time
        "inter-op dispatch": 100.0 - (5 + 20 + 8 + 29 + 7),  # between operators
    }
    assert sum(a.seconds.values()) == pytest.approx(a.wall_s) and a.wall_s == pytest.approx(100e-6)
    assert a.overlapped_s is None  # no collective library threads seen
    assert a.operators[("aten::addmm", "kernel")] == pytest.approx(24e-6)
    assert a.operators[("aten::linear", "intra-op dispatch")] == pytest.approx(4e-6)


def test_a_collective_threads_work_is_exposed_while_the_step_waits_and_overlapped_while_it_computes() -> None:
    gloo = [Ev("gloo:all_reduce", 85, 95, thread=2), Ev("gloo:all_reduce", 20, 30, thread=3)]
    a = analyse_step(step_tree(), other_threads=gloo)
    assert a.seconds["communication"] == pytest.approx((8 + 10) * 1e-6)  # 85..95: the step only waited then
    assert a.seconds["inter-op dispatch"] == pytest.approx((100 - 69 - 10) * 1e-6)
    assert a.overlapped_s == pytest.approx(10e-6)  # 20..30 ran under addmm's kernel
    assert sum(a.seconds.values()) == pytest.approx(a.wall_s)


def test_on_an_accelerator_device_kernels_decide_and_idle_time_goes_by_the_host() -> None:
    step = Ev("ProfilerStep#1", 0, 50, [Ev("aten::linear", 2, 12, [Ev("aten::addmm", 3, 11)])])
    kernels = [(10.0, 30.0, "ampere_sgemm_128x64"), (25.0, 45.0, "ncclDevKernel_AllReduce_Sum_f32")]
    a = analyse_step(step, device_kernels=kernels)
    us = {k: round(v * 1e6, 6) for k, v in a.seconds.items()}
    assert us["kernel"] == 20.0  # 10..30
    assert us["communication"] == 15.0  # 30..45: communication with no compute beside it
    assert a.overlapped_s == pytest.approx(5e-6)  # 25..30
    # idle device 0..10 and 45..50: the host launching (addmm 3..10: intra-op), in linear's own time (2..3), else
    assert us["intra-op dispatch"] == 8.0
    assert us["inter-op dispatch"] == 2.0 + 5.0
    assert sum(a.seconds.values()) == pytest.approx(a.wall_s)


def test_a_profiled_run_keeps_its_timed_epochs_and_records_the_breakdown_and_trace(tmp_path: Path) -> None:
    config = tiny_config(epochs=3, steps_per_epoch=4, output_dir=tmp_path, profile=True, profile_steps=3)
    record, path, status = run(config, get_host())
    assert status == "ok"
    prof = record.profile
    assert prof is not None and prof.steps == 3 and set(prof.seconds) == set(CATEGORIES)
    assert sum(prof.seconds.values()) == pytest.approx(prof.step_s, rel=1e-6)  # the split is the whole step
    assert prof.seconds["kernel"] > 0 and prof.top_operators and prof.timed_step_s
    assert "after the 3 timed epoch(s)" in prof.window
    assert [e.steps for e in record.metrics.epochs] == [4, 4, 4]  # profiled steps are not in any epoch
    trace = path.parent / prof.trace
    assert trace.name == path.name.removesuffix(".json") + ".trace.json.gz"
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert any(e.get("name", "").startswith("ProfilerStep") for e in events)
    assert read_record(path) == record
    assert not list(tmp_path.glob(".trace-*"))  # no temporary left behind


@pytest.mark.slow
def test_two_processes_over_gloo_show_their_communication(tmp_path: Path) -> None:
    proc = accelbench(
        "run", *TINY, "--epochs", "2", "--steps-per-epoch", "3", "--profile", "--profile-steps", "4",
        "--strategy", "ddp", "--devices", "2", "--output-dir", str(tmp_path), "-q",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "USDT:" not in proc.stderr  # the profiler's own start/stop chatter is kept out
    record = read_record(next(tmp_path.glob("*.json")))
    prof = record.profile
    assert prof is not None and prof.seconds["communication"] > 0
    assert sum(prof.seconds.values()) == pytest.approx(prof.step_s, rel=1e-6)


def test_compare_and_report_put_breakdowns_side_by_side(tmp_path: Path, capsys) -> None:
    from accelbench.cli import main

    config = tiny_config(
        epochs=2, steps_per_epoch=3, output_dir=tmp_path / "a", profile=True, profile_steps=2
    )
    run(config, get_host())
    run(config.model_copy(update={"output_dir": tmp_path / "b", "threads": 1}), get_host())
    assert (
        main(
            ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--label-by", "dir", "--format", "markdown"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Where a step's time goes (run --profile):" in out
    assert "| system | devices | step ms | data | optimizer | communication | kernel |" in out
    # in the comparison, the breakdown and the predictions every record carries
    assert out.count("| a | 1 |") == 3 and out.count("| b | 1 |") == 3
    assert "Predicted (accelbench estimate's model) against measured:" in out
    pytest.importorskip("matplotlib")
    from accelbench.compare import compare, load_records
    from accelbench.report import build_report

    report = build_report(compare(load_records([tmp_path / "a", tmp_path / "b"]), label_by=("dir",)))
    figure = next(f for f in report.figures if f.title.startswith("Where a step's time goes"))
    (panel,) = [ax for ax in figure.figure.axes if ax.get_title()]
    assert {c.get_label() for c in panel.containers} >= set(CATEGORIES)  # one stacked segment per category


@dataclass
class DeviceEv(Ev):
    """An event on the accelerator's timeline (FunctionEvent's device_type CUDA)."""

    device_type: str = "DeviceType.CUDA"


def test_the_devices_projections_of_host_annotations_are_no_kernels() -> None:
    """The device's timeline carries a projection of each host annotation (kineto's gpu_user_annotation) over the
    kernels launched inside it. On an H100 the ProfilerStep's projection, taken for a kernel, made a gpt2 step
    52.5 ms of "kernel" of 52.7, where its kernels ran 18.1 ms (docs/gpu/h100-2026-11-27)."""
    from accelbench.engine.profile import analyse_events

    step = Ev("ProfilerStep#1", 0, 50, [
        Ev("accelbench::data", 0, 2, is_user_annotation=True),
        Ev("aten::linear", 2, 12, [Ev("aten::addmm", 3, 11)]),
        Ev("Optimizer.step#AdamW.step", 40, 48, is_user_annotation=True),
    ], is_user_annotation=True)  # fmt: skip
    on_device = [
        DeviceEv(
            "ProfilerStep#1", 4, 47, is_user_annotation=True
        ),  # the step's projection: no work of its own
        DeviceEv(
            "Optimizer.step#AdamW.step", 41, 47
        ),  # one a torch may not flag: known by its host twin's name
        DeviceEv("sm90_xmma_gemm_bf16", 10, 20),
        DeviceEv("multi_tensor_apply_kernel", 42, 46),
    ]
    host = [step, *step.children]
    (a,) = analyse_events([*host, *on_device], "cuda")
    assert a.seconds["kernel"] == pytest.approx(
        (10 + 4) * 1e-6
    )  # the two kernels, not the projections' 4..47
    assert sum(a.seconds.values()) == pytest.approx(a.wall_s)
