"""Reference loss trajectories: what training a workload right looks like, made by accelbench itself.

For gpt-nano and gpt-micro at a fixed recipe (:data:`RECIPE`: fp32, one device, the generated corpus, batch 16, 4
epochs of 20 steps, 4 held-out batches) and :data:`SEEDS`, the held-out loss after every epoch, shipped as
``gpt.json`` with how it was made (accelbench and torch versions, host, date, the command). ``compare`` tests a
run of the same recipe, whatever its precision, strategy or backend, against it (:meth:`Reference.verdict`): its
held-out loss after the reference's last epoch must lie in the seeds' 99% prediction interval,

    mean ± max(t(0.995, n - 1) · s · sqrt(1 + 1/n), 1% of the mean)

(n seeds, s their standard deviation; Student's t, as a normal sample predicts one more draw; the 1% floor
covers the spread of the last digits between thread counts and CPUs, which three seeds may not show). A run
outside it trains differently from single-device fp32 and is marked so beside its speed.

Regenerate with ``python -m accelbench.references`` (minutes on a CPU).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REFERENCE_FILE = Path(__file__).with_name("gpt.json")
MODELS = ("gpt-nano", "gpt-micro")
SEEDS = (0, 1, 2)
# the reference recipe: run fields that must match for a run to be tested against it (batch: the global batch)
RECIPE: dict[str, Any] = {
    "workload": "gpt",
    "batch_size": 16,
    "steps_per_epoch": 20,
    "epochs": 4,
    "learning_rate": 3e-4,
    "eval_batches": 4,
    "precision": "fp32",
    "strategy": "single",
}
# Student's t quantile 0.995 by degrees of freedom (n seeds - 1): a two-sided 99% interval
T_995 = {1: 63.657, 2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032, 6: 3.707, 7: 3.499, 8: 3.355, 9: 3.250}
FLOOR = 0.01


@dataclass(frozen=True)
class Reference:
    """One model's reference: every seed's held-out loss per epoch, and the identity a run must share."""

    model: str
    identity: dict[str, Any]
    trajectories: dict[int, list[float]]  # seed -> held-out loss after each epoch

    @property
    def epochs(self) -> int:
        return min(len(t) for t in self.trajectories.values())

    def band(self, epoch: int | None = None) -> tuple[float, float]:
        """The 99% prediction interval of the held-out loss after ``epoch`` (counted from 1; default: the last)
        (module docstring)."""
        finals = [t[(epoch or self.epochs) - 1] for t in self.trajectories.values()]
        mean = statistics.fmean(finals)
        n = len(finals)
        spread = T_995[n - 1] * statistics.stdev(finals) * math.sqrt(1 + 1 / n) if n > 1 else 0.0
        half = max(spread, FLOOR * abs(mean))
        return mean - half, mean + half

    def targets(self) -> dict[str, float]:
        """The named targets (``--target NAME``): ``ref-epochN`` is the upper end of the band after epoch N, the
        held-out loss a run that trains as the reference does reaches by its epoch N 99 times in 100."""
        return {f"ref-epoch{epoch}": self.band(epoch)[1] for epoch in range(1, self.epochs + 1)}

    def verdict(self, val_losses: list[float | None]) -> float | None:
        """The run's held-out loss after the reference's last epoch, if it trained that long and measured it."""
        if len(val_losses) < self.epochs:
            return None
        return val_losses[self.epochs - 1]


def load(path: Path = REFERENCE_FILE) -> dict[str, Reference]:
    """The shipped references by model name (none where the file is missing)."""
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    return {
        model: Reference(
            model,
            entry["identity"],
            {int(seed): [float(v) for v in losses] for seed, losses in entry["trajectories"].items()},
        )
        for model, entry in raw["models"].items()
    }


def named_targets(references: dict[str, Reference] | None = None) -> dict[str, dict[str, float]]:
    """Every model's named targets (:meth:`Reference.targets`), by model name."""
    return {
        model: reference.targets()
        for model, reference in (load() if references is None else references).items()
    }


def describe_targets(references: dict[str, Reference] | None = None) -> str:
    """The named targets as ``run --help`` lists them: ``gpt-nano: ref-epoch1 (3.80), ...; gpt-micro: ...``."""
    return "; ".join(
        f"{model}: " + ", ".join(f"{name} ({value:.3f})" for name, value in targets.items())
        for model, targets in named_targets(references).items()
    )


def resolve_target(model: str, name: str, references: dict[str, Reference] | None = None) -> float:
    """The validation loss ``--target NAME`` stands for with ``--model model``; ValueError (naming what works)
    where the model has no reference or no target of that name."""
    targets = named_targets(references)
    if model not in targets:
        have = ", ".join(targets) or "none"
        raise ValueError(
            f"--target {name}: the model {model} has no reference trajectory, so no named targets (models with "
            f"one: {have}); give a validation loss with --target-loss X instead"
        )
    if name not in targets[model]:
        raise ValueError(
            f"--target {name}: no such target for {model}; its targets: "
            + ", ".join(f"{n} ({v:.3f})" for n, v in targets[model].items())
        )
    return targets[model][name]


def reference_for(
    config: dict[str, Any], identity: dict[str, Any], world_size: int, references: dict[str, Reference]
) -> Reference | None:
    """The reference a run of ``config`` (its record's, as a dict) is tested against: the same workload, model,
    identity, global batch, steps, learning rate and held-out batches on the generated corpus; precision, strategy
    and backend may differ (that is what the test is for)."""
    reference = references.get(str(config.get("model")))
    if reference is None or config.get("workload") != RECIPE["workload"] or config.get("data") is not None:
        return None
    same = (
        int(config.get("batch_size", 0)) * world_size == RECIPE["batch_size"]
        and config.get("steps_per_epoch") == RECIPE["steps_per_epoch"]
        and math.isclose(float(config.get("learning_rate", 0.0)), RECIPE["learning_rate"])
        and config.get("eval_batches") == RECIPE["eval_batches"]
        and identity == reference.identity
    )
    return reference if same else None


def regenerate(path: Path = REFERENCE_FILE, output_dir: Path | None = None) -> dict[str, Any]:
    """Train every model of :data:`MODELS` at the recipe for every seed of :data:`SEEDS` and write the references
    with how they were made. Returns what was written."""
    import tempfile
    from datetime import datetime, timezone

    import torch

    from accelbench import __version__
    from accelbench.config import RunConfig
    from accelbench.engine.runner import run
    from accelbench.hostinfo import usable_cores
    from accelbench.plugins import get_host

    models: dict[str, Any] = {}
    out = output_dir or Path(tempfile.mkdtemp(prefix="accelbench-references-"))
    for model in MODELS:
        trajectories: dict[str, list[float]] = {}
        identity: dict[str, Any] = {}
        for seed in SEEDS:
            # one thread: deterministic, and never stalled by OpenMP barriers on a shared host
            config = RunConfig(
                **{**RECIPE, "model": model, "seed": seed, "backend": "cpu", "threads": 1, "output_dir": out}
            )
            record, _, status = run(config, get_host())
            if record is None or status != "ok" or record.quality is None:
                raise RuntimeError(f"reference run {model} seed {seed} ended {status}")
            trajectories[str(seed)] = [q.val_loss for q in record.quality.epochs if q.val_loss is not None]
            identity = dict(record.workload_identity)
        models[model] = {"identity": identity, "trajectories": trajectories}
    made = {
        "how": "python -m accelbench.references: accelbench run at the recipe below for each model and seed, on "
        "the CPU backend (one thread), fp32, one device, the generated corpus; trajectories are quality.epochs[].val_loss",
        "recipe": RECIPE,
        "seeds": list(SEEDS),
        "accelbench": __version__,
        "torch": torch.__version__,
        "threads": 1,
        "cores": usable_cores(),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "test": "held-out loss after the last epoch within mean ± max(t(0.995, n-1) s sqrt(1 + 1/n), 1% of mean)",
    }
    written = {"made": made, "models": models}
    path.write_text(json.dumps(written, indent=1) + "\n")
    return written
