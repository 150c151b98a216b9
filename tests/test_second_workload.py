"""A workload registered from outside the core runs, sweeps, compares and reports with no change to run, compare,
report or sweep: its options, size names, identity and units are its own (through the workload hook)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from core_support import Site, accelbench

# A plugin distribution that registers one workload and no backend: a small MLP regressing random data.
TOY = '''
import math
import torch
from torch import nn
from accelbench.contract import hookimpl
from accelbench.contract import RunOption
from accelbench.errors import ConfigError
from accelbench.workloads import ModelUnits, TrainingJob

accelbench_contract = "3.0"
SIZES = {"toy-s": 2, "toy-m": 4}


class Regression:
    """Random inputs, a fixed random linear target: deterministic per seed and epoch."""

    def __init__(self, width, batch, seed, steps):
        self.width, self.batch, self.seed, self.max_steps = width, batch, seed, steps
        self.samples_per_epoch = 64

    def steps(self, rank=0, world_size=1):
        steps = math.ceil(math.ceil(self.samples_per_epoch / world_size) / self.batch)
        return min(steps, self.max_steps) if self.max_steps else steps

    def batches(self, epoch, rank=0, world_size=1):
        g = torch.Generator().manual_seed(self.seed * 1000 + epoch * 10 + rank)
        target = torch.randn(self.width, 1, generator=torch.Generator().manual_seed(self.seed))
        for _ in range(self.steps(rank, world_size)):
            x = torch.randn(self.batch, self.width, generator=g)
            yield x, x @ target

    def describe(self):
        return {"source": "random regression", "width": self.width}


class Mlp(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.out = nn.Linear(width, 1)

    def forward(self, x, y):
        h = torch.relu(self.inp(x))
        for layer in self.layers:
            h = torch.relu(layer(h))
        return nn.functional.mse_loss(self.out(h), y)


class ToyWorkload:
    name = "toy"
    description = "a small MLP regressing random data (a test workload from a plugin)"

    def options(self):
        return [RunOption(name="width", type="int", default=8, gt=0, help="hidden width", workload="toy")]

    def model_names(self):
        return list(SIZES)

    def check(self, config):
        if config.workload_options["width"] > 4096:
            raise ConfigError("--width: the toy workload stays small (at most 4096)")

    def identity(self, config):
        return {"model": config.model, "width": config.workload_options["width"]}

    def units(self, config):
        depth = SIZES[config.model]
        return ModelUnits(stem=("inp",), units=tuple(f"layers.{i}" for i in range(depth)), head=("out",))

    def build(self, config):
        width, depth = config.workload_options["width"], SIZES[config.model]
        torch.manual_seed(config.seed)
        model = Mlp(width, depth)
        n = sum(p.numel() for p in model.parameters())
        lr = config.learning_rate
        return TrainingJob(
            model=model,
            data=Regression(width, config.batch_size, config.seed, config.steps_per_epoch),
            make_optimizer=lambda m, device, kernels: torch.optim.AdamW(m.parameters(), lr=lr),
            flops_per_sample=6.0 * n,
            flops_formula="6N per sample (N = parameters)",
            tokens_per_sample=1,
            units=self.units(config),
            summary={"name": config.model, "parameters": n, "width": width, "depth": depth},
        )


@hookimpl
def accelbench_register_workloads(register):
    register(ToyWorkload())
'''


def install_toy(site: Site) -> dict[str, str]:
    site.add_distribution("accelbench-toy", {"toy": "toy_workload"}, {"toy_workload": TOY})
    return site.env()


@pytest.mark.slow
def test_a_plugin_workload_runs_sweeps_compares_and_reports(site: Site, tmp_path: Path) -> None:
    env = install_toy(site)
    out = tmp_path / "results"
    args = ["--workload", "toy", "--epochs", "2", "--steps-per-epoch", "2", "--batch-size", "8"]
    for model, width in (("toy-s", "8"), ("toy-m", "16")):
        proc = accelbench(
            "run", *args, "--model", model, "--width", width, "--output-dir", str(out), "-q", env=env
        )
        assert proc.returncode == 0, proc.stderr
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert [r["workload_identity"] for r in records] == [
        {"model": "toy-s", "width": 8},
        {"model": "toy-m", "width": 16},
    ]
    assert [r["config"]["workload_options"] for r in records] == [{"width": 8}, {"width": 16}]
    assert all(r["outcome"]["status"] == "ok" and r["metrics"]["steady"] for r in records)

    # its own options are checked and refused like the core's, before anything runs
    refused = accelbench("run", *args, "--model", "toy-s", "--width", "0", "--output-dir", str(out), env=env)
    assert refused.returncode == 2 and "--width: Input should be greater than 0" in refused.stderr
    refused = accelbench("run", *args, "--model", "gpt2", "--output-dir", str(out), env=env)
    assert refused.returncode == 2 and "unknown model 'gpt2' for workload 'toy'" in refused.stderr
    refused = accelbench(
        "run", *args, "--model", "toy-s", "--block-size", "64", "--output-dir", str(out), env=env
    )
    assert refused.returncode == 2 and "workload 'toy' has no option 'block_size'" in refused.stderr

    # compare groups by the workload's own identity
    compared = accelbench("compare", str(out), "--format", "json", env=env)
    assert compared.returncode == 0, compared.stderr
    groups = json.loads(compared.stdout)["groups"]
    assert len(groups) == 2 and all(g["workload"]["workload"] == "toy" for g in groups)
    assert {g["workload"]["model"] for g in groups} == {"toy-s", "toy-m"}
    assert {g["workload"]["identity"] for g in groups} == {"width=8", "width=16"}

    # report draws it
    html = tmp_path / "report.html"
    reported = accelbench("report", str(out), "-o", str(html), env=env)
    assert reported.returncode == 0, reported.stderr
    assert "toy-s" in html.read_text()

    # a sweep over its option, resumable like any other
    sweep = tmp_path / "toy.toml"
    sweep.write_text(
        '[run]\nworkload = "toy"\nmodel = "toy-s"\nepochs = 2\nsteps_per_epoch = 2\nbatch_size = 8\n'
        "[[grid]]\nwidth = [4, 8]\n"
    )
    swept = accelbench("sweep", str(sweep), "--output-dir", str(tmp_path / "swept"), "--quiet", env=env)
    assert swept.returncode == 0, swept.stderr
    widths = sorted(json.loads(p.read_text())["config"]["workload_options"]["width"]
                    for p in (tmp_path / "swept").glob("*.json"))  # fmt: skip
    assert widths == [4, 8]
    again = accelbench("sweep", str(sweep), "--output-dir", str(tmp_path / "swept"), env=env)
    assert again.returncode == 0 and "already recorded" in again.stderr
