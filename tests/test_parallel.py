"""Tensor, pipeline and composed parallelism in real 2- and 4-process gloo jobs through `accelbench run`.

Parallelism must not change the maths: with the same seed, fp32 and no dropout, every layout's per-epoch losses
match single-device training of the same model (data-parallel layouts: DDP on as many replicas, which is
single-device training of the replicas' batches together). Measured on torch 2.13 (CPU, gloo), the losses agree to
6e-7 or better (float sums in another order; most layouts agree exactly); the tolerance is 1e-5 absolute on losses
near 4.17.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from core_support import Site, accelbench, accelbench_here

from accelbench.results import ResultRecord, read_record

TINY = ["--model", "custom", "--layers", "4", "--heads", "2", "--embd", "16", "--block-size", "16",
        "--batch-size", "8", "--dropout", "0", "--epochs", "2", "--steps-per-epoch", "3", "-q"]  # fmt: skip
LOSS_TOLERANCE = 1e-5
SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev"]


class Runs:
    """Runs of this module, each made once and kept (a run is several seconds of several processes)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[tuple[str, ...], ResultRecord] = {}

    def __call__(self, *args: str) -> ResultRecord:
        if args not in self.done:
            out = self.root / f"run{len(self.done)}"
            proc = accelbench("run", *TINY, *args, "--output-dir", str(out), timeout=240)
            assert proc.returncode == 0, proc.stderr[-3000:]
            files = sorted(out.glob("*.json"))
            assert len(files) == 1, files
            self.done[args] = read_record(files[0])
            shutil.copy(files[0], self.root / "all")
        return self.done[args]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("parallel")
    (root / "all").mkdir()
    return Runs(root)


def losses(record: ResultRecord) -> list[float]:
    assert record.outcome.status == "ok", record.outcome.message
    assert record.metrics is not None
    return [e.loss for e in record.metrics.epochs if e.loss is not None]


def assert_same_losses(record: ResultRecord, reference: ResultRecord) -> None:
    assert losses(record) == pytest.approx(losses(reference), abs=LOSS_TOLERANCE, rel=0)


@pytest.mark.parametrize("extra", [[], ["--sequence-parallel"]], ids=["tp", "tp+sequence-parallel"])
@pytest.mark.slow
def test_tensor_parallel_matches_single_device(runs: Runs, extra: list[str]) -> None:
    record = runs("--strategy", "tp", "--devices", "2", *extra)
    assert_same_losses(record, runs())
    assert (record.config.strategy, record.config.mesh, record.world_size) == ("tp", "tp=2", 2)
    tp = record.executor["tensor_parallel"]
    assert tp["size"] == 2 and tp["sequence_parallel"] == bool(extra)
    assert ["attn.qkv", "colwise:3"] in tp["plan"]
    m = record.metrics
    assert m is not None and m.steady is not None
    # one copy of the model on two ranks: its samples count once
    assert [e.samples for e in m.epochs] == [24, 24] and [r.epoch_samples for r in m.ranks] == [
        [24, 24],
        [0, 0],
    ]
    assert m.megatron_flops_per_sample and m.steady.megatron_tflops_per_device
    assert m.steady.megatron_tflops_per_device == pytest.approx(
        m.steady.samples_per_s * m.megatron_flops_per_sample / 2 / 1e12
    )
    assert record.executor["analytical"]["communication_bytes"]["tp"] > 0


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.slow
def test_every_pipeline_schedule_matches_single_device(runs: Runs, schedule: str) -> None:
    """Every schedule torch.distributed.pipelining offers runs on CPU over gloo (torch 2.13)."""
    record = runs("--strategy", "pp", "--devices", "2", "--pp-schedule", schedule)
    assert_same_losses(record, runs())
    pipeline = record.executor["pipeline"]
    looped = schedule not in ("gpipe", "1f1b")
    assert pipeline["schedule"] == schedule and pipeline["virtual_stages"] == (2 if looped else 1)
    assert pipeline["microbatches"] == pipeline["stages"] == (4 if looped else 2)
    units = [u for stage in pipeline["stage_units"] for u in stage["units"]]
    assert units == [f"blocks.{i}" for i in range(4)]  # every unit on exactly one stage, in order
    assert pipeline["stage_units"][0]["stem"] == ["wte", "wpe", "drop"]
    assert pipeline["stage_units"][-1]["head"] == ["ln_f", "lm_head"]
    assert pipeline["tied"] == ["lm_head.weight untied from wte.weight on the stage that lacks it; gradients "
                                "summed after each backward"]  # fmt: skip
    bubble = pipeline["bubble"]
    expected = {"gpipe": 1 / 3, "1f1b": 1 / 3, "interleaved-1f1b": 1 / 9, "looped-bfs": 1 / 9}.get(schedule)
    assert bubble["analytical"] == (pytest.approx(expected) if expected is not None else None)
    assert 0.0 <= bubble["measured"] <= 1.0
    assert [r["pp_rank"] for r in bubble["per_rank"]] == [0, 1]
    assert all(r["peak_memory_bytes"] and 0.0 <= r["idle_fraction"] <= 1.0 for r in bubble["per_rank"])


@pytest.mark.parametrize(
    ("mesh", "reference"),
    [
        ("tp=2,pp=2", ()),  # no data parallelism: single-device training
        ("dp=2,tp=2", ("--strategy", "ddp", "--devices", "2")),  # FSDP2 x tensor parallelism (2D DTensors)
        ("dp=2,pp=2", ("--strategy", "ddp", "--devices", "2")),  # FSDP2 per pipeline stage
        ("ddp=2,pp=2", ("--strategy", "ddp", "--devices", "2")),  # DDP per pipeline stage
    ],
)
@pytest.mark.slow
def test_two_dimensional_meshes_match_the_same_training_without_them(
    runs: Runs, mesh: str, reference: tuple[str, ...]
) -> None:
    record = runs("--mesh", mesh, "--devices", "4")
    assert_same_losses(record, runs(*reference))
    assert record.config.strategy == "mesh" and record.world_size == 4
    described = record.executor["mesh"]
    assert described["order"] == [a for a in ("pp", "dp", "tp") if f"{a}=" in mesh.replace("ddp", "dp")]
    assert all(axis["within_node"] for axis in described["axes"].values())  # one node
    replicas = 2 if "dp=" in mesh else 1
    assert record.metrics is not None and record.metrics.epochs[0].samples == 24 * replicas


@pytest.mark.slow
def test_three_dimensional_mesh_matches_data_parallel_training(runs: Runs) -> None:
    """dp x tp x pp on 8 processes (slow on two cores)."""
    record = runs("--mesh", "dp=2,tp=2,pp=2", "--devices", "8", "--collective-timeout", "300")
    assert_same_losses(record, runs("--strategy", "ddp", "--devices", "2"))
    assert record.executor["mesh"]["sizes"] == {"dp": 2, "tp": 2, "pp": 2}


NO_TP = """
from accelbench.contract import Backend, BackendInfo, DeviceInfo, hookimpl
accelbench_contract = "3.0"

@hookimpl
def accelbench_register_backends(register):
    register(NoTpBackend)

class NoTpBackend(Backend):
    info = BackendInfo(name="notp", device_type="cpu", device_unit="test CPU", priority=-10)

    def detect_devices(self):
        return [DeviceInfo(index=0, name="CPU without tensor parallelism")]

    def supported_strategies(self, device):
        return ["single", "ddp", "fsdp"]
"""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--mesh", "dp=2,tp=2", "--devices", "2"],
            "--mesh dp=2,tp=2: its sizes multiply to 4 device(s), but the job "
            "has 2 (--devices 2 x --nnodes 1)",
        ),  # fmt: skip
        (
            ["--mesh", "tp=4", "--devices", "4"],
            "tensor parallelism over 4 devices does not divide the model's 2 attention heads",
        ),  # fmt: skip
        (
            ["--mesh", "pp=2", "--devices", "2", "--pp-schedule", "looped-bfs", "--virtual-stages", "4"],
            "8 pipeline stages (2 ranks x 4 stages each) for a model of 4 layers",
        ),
        (
            ["--mesh", "pp=2", "--devices", "2", "--microbatches", "3"],
            "--microbatches 3 does not divide --batch-size 8",
        ),
    ],
    ids=["mesh-not-world", "tp-not-heads", "stages-over-layers", "microbatches-not-batch"],
)
def test_layouts_that_cannot_run_are_refused_before_launch(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    # in this process (the launcher's side of the command); capfd, so a worker's output would be seen too
    code, stderr = accelbench_here(capfd, "run", *TINY, *args, "--output-dir", str(tmp_path / "out"))
    assert code == 2, stderr[-2000:]
    assert message in " ".join(stderr.split())
    assert "[rank" not in stderr and "exited with code" not in stderr  # no worker was started
    assert not (tmp_path / "out").exists()


def test_a_backend_without_tensor_parallelism_refuses_a_tp_mesh_before_launch(
    site: Site, tmp_path: Path
) -> None:
    site.add_distribution("accelbench-notp", {"notp": "notp_plugin"}, {"notp_plugin": NO_TP})
    out = tmp_path / "out"
    proc = accelbench("run", *TINY, "--backend", "notp", "--mesh", "tp=2", "--devices", "2", "--output-dir", str(out),
                      env=site.env())  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "does not support strategy 'tp'" in " ".join(proc.stderr.split())
    assert "[rank" not in proc.stderr and "exited with code" not in proc.stderr  # no worker was started
    assert not out.exists()


@pytest.mark.slow
def test_compare_and_report_show_mesh_bubble_and_tflops_per_device(runs: Runs, tmp_path: Path) -> None:
    for mesh in ("tp=2,pp=2", "dp=2,tp=2", "dp=2,pp=2"):
        runs("--mesh", mesh, "--devices", "4")
    folder = runs.root / "all"
    proc = accelbench("compare", str(folder), "--format", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    groups = json.loads(proc.stdout)["groups"]
    workloads = [g["workload"] for g in groups]
    meshes = {w.get("mesh") for w in workloads}
    assert {"tp=2,pp=2", "fsdp=2,tp=2", "fsdp=2,pp=2"} <= meshes  # grouped (and labelled) by mesh
    pipelined = next(w for w in workloads if w.get("mesh") == "tp=2,pp=2")
    assert (pipelined["pp_schedule"], pipelined["microbatches"]) == ("1f1b", 2)
    table = accelbench("compare", str(folder), "--format", "markdown")
    assert "mesh tp=2,pp=2 · 1f1b schedule · 2 microbatches" in table.stdout
    pytest.importorskip("matplotlib")
    report = tmp_path / "report.html"
    proc = accelbench("report", str(folder), "-o", str(report))
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = report.read_text(encoding="utf-8")
    for axes in ("tp, pp", "dp, pp", "tp, dp"):  # seed 003, figures 13, 14 and 15
        assert f"TFLOP/s per device against the mesh ({axes})" in page
    assert "Pipeline bubble: custom 4L/2H/16E" in page
