"""Reference loss trajectories: what training a workload right looks like, made by accelbench itself.

For each file of :data:`REFERENCES` (gpt-nano, gpt-micro, gpt-mini, gopher-44m, ipu-384, gpt2 to gpt2-large, the
llamas to llama-small, the BERTs to bert-large, moe-tiny, moe-mini and deepseek-tiny, the MobileNetV3s, ResNet-50
and EfficientNet-B0 at 32 pixels) at a fixed recipe (:data:`RECIPE`: fp32, one device,
generated data, batch 16, 4 epochs of 20 steps, 4 held-out batches, plus the workload's options; gpt2 at a smaller
one of its own, :attr:`Recipe.changes`) and :data:`SEEDS`, the held-out loss after every epoch, shipped as
``<name>.json`` with how it was made (the recipe, accelbench and torch versions, host, date, the command).
``compare`` tests a run of the same recipe and identity, whatever its precision, strategy or backend, against it
(:meth:`Reference.outside_epochs`): its held-out loss after every epoch must lie in that epoch's 99% prediction
interval over the seeds,

    mean ± max(t(0.995, n - 1) · s · sqrt(1 + 1/n), 1% of the mean)

(n seeds, s their standard deviation; Student's t, as a normal sample predicts one more draw; the 1% floor
covers the spread of the last digits between thread counts and CPUs, which three seeds may not show); two or more
seeds of a run are tested together by Welch's t-test (:meth:`Reference.seeds_test`). A run outside trains
differently from single-device fp32 and is marked so beside its speed. The same intervals give the named targets
(``--target ref-epochN``, :meth:`Reference.targets`).

Regenerate with ``python -m accelbench.references`` (every file; name some to redo only those): about 6 hours
on a shared 2-core VM, each run on one thread (each file's ``made.seconds`` and ``made.cpu_seconds``).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REFERENCE_DIR = Path(__file__).parent
REFERENCE_FILE = REFERENCE_DIR / "gpt.json"
SEEDS = (0, 1, 2)
# where three seeds disagree much, five: Student's t at 4 degrees of freedom (4.604) against 2 (9.925) makes the band
# less than half as wide for the same spread, at 5/3 of the regeneration's time
FIVE_SEEDS = (0, 1, 2, 3, 4)
# the recipe a reference is made at unless its file's Recipe changes some fields: run fields a run must share to
# be tested against it (batch: the global batch, per-device batch x processes); the workload's own options are in
# each file's Recipe
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


@dataclass(frozen=True)
class Recipe:
    """How one reference file is made: the workload, its models, the workload options (part of the identity a run
    must share) and the fields of :data:`RECIPE` it changes, with why, and the seeds. A size too slow for one CPU
    core at :data:`RECIPE` gets a smaller recipe of its own; a run is only tested against a reference of its own
    recipe. A model whose seeds disagree much gets more seeds (:data:`FIVE_SEEDS`), which narrow its bands."""

    workload: str
    models: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)
    changes: dict[str, Any] = field(default_factory=dict)
    why: str = ""
    seeds: tuple[int, ...] = SEEDS

    @property
    def fields(self) -> dict[str, Any]:
        """The whole recipe: :data:`RECIPE` with this file's changes."""
        return {**RECIPE, **self.changes, "workload": self.workload}


# The image models: 32 pixels and 8 classes (each synthetic image is tinted with its class's hue, so any crop shows
# its class); precise batch norm over 20 training batches before each evaluation, as 80 steps leave MobileNetV3's
# running statistics (momentum 0.01) near their initial values and the held-out loss at ln 8 whatever was learnt;
# no data workers, as the reference runs in one thread (augmentation is seeded per sample, so workers never change
# the numbers: data_workers is not matched).
IMAGE = {"image_size": 32, "num_classes": 8, "precise_bn": 20, "data_workers": 0}
# file name (<name>.json) -> how it is made. llama and bert at 128 tokens keep a run under a minute or two on one
# core; gpt2 at RECIPE takes about 15 minutes a seed on one core (9.8 s a step), so its recipe is a quarter of the
# tokens a step and half the steps (2.7 s a step).
REFERENCES: dict[str, Recipe] = {
    "gpt": Recipe("gpt", ("gpt-nano", "gpt-micro")),
    "gpt-mini": Recipe("gpt", ("gpt-mini",)),
    "gopher-44m": Recipe("gpt", ("gopher-44m",), seeds=FIVE_SEEDS),
    "ipu-384": Recipe("gpt", ("ipu-384",), seeds=FIVE_SEEDS),
    "gpt2": Recipe(
        "gpt",
        ("gpt2",),
        {"block_size": 64},
        {"batch_size": 8, "steps_per_epoch": 10},
        "gpt2 (85M parameters) at batch 16 of 128-token windows takes 9.8 s a step on one core, 15 minutes a "
        "seed; batch 8 of 64-token windows and 10 steps an epoch take 2.7 s a step, about 2.5 minutes a seed",
    ),
    "gpt2-medium": Recipe(
        "gpt",
        ("gpt2-medium",),
        {"block_size": 64},
        {"batch_size": 8, "steps_per_epoch": 10},
        "gpt2-medium at gpt2's recipe (batch 8 of 64-token windows, 10 steps an epoch), for the same reason: the "
        "common recipe would take about an hour a seed on one core",
        seeds=FIVE_SEEDS,
    ),
    "gpt2-large": Recipe(
        "gpt",
        ("gpt2-large",),
        {"block_size": 64},
        {"batch_size": 8, "steps_per_epoch": 10},
        "gpt2-large (708M parameters) at gpt2's recipe (batch 8 of 64-token windows, 10 steps an epoch); at the "
        "common recipe a seed would take hours on one core",
        seeds=FIVE_SEEDS,
    ),
    "llama": Recipe("llama", ("llama-tiny",), {"seq_len": 128}),
    "llama-mini": Recipe("llama", ("llama-mini",), {"seq_len": 128}),
    "llama-small": Recipe("llama", ("llama-small",), {"seq_len": 128}),
    "bert": Recipe("bert", ("bert-tiny",), {"seq_len": 128}, seeds=FIVE_SEEDS),
    "bert-mini": Recipe("bert", ("bert-mini",), {"seq_len": 128}, seeds=FIVE_SEEDS),
    "bert-small": Recipe("bert", ("bert-small",), {"seq_len": 128}, seeds=FIVE_SEEDS),
    "bert-medium": Recipe("bert", ("bert-medium",), {"seq_len": 128}, seeds=FIVE_SEEDS),
    "bert-base": Recipe(
        "bert",
        ("bert-base",),
        {"seq_len": 128},
        {"batch_size": 8, "steps_per_epoch": 10},
        "bert-base (110M parameters) at batch 16 and 20 steps an epoch would take about an hour for the three seeds "
        "on one core; batch 8 and 10 steps an epoch, a quarter of that, as gpt2's recipe",
        seeds=FIVE_SEEDS,
    ),
    "bert-large": Recipe(
        "bert",
        ("bert-large",),
        {"seq_len": 128},
        {"batch_size": 8, "steps_per_epoch": 10},
        "bert-large (335M parameters) at bert-base's recipe (batch 8, 10 steps an epoch), for the same reason",
        seeds=FIVE_SEEDS,
    ),
    "moe": Recipe("moe", ("moe-tiny",), {"seq_len": 128}),
    "moe-mini": Recipe("moe", ("moe-mini",), {"seq_len": 128}),
    "deepseek-tiny": Recipe("moe", ("deepseek-tiny",), {"seq_len": 128}),
    "mobilenet-v3-small": Recipe("mobilenet-v3-small", ("mobilenet-v3-small",), IMAGE, seeds=FIVE_SEEDS),
    "mobilenet-v3-large": Recipe("mobilenet-v3-large", ("mobilenet-v3-large",), IMAGE, seeds=FIVE_SEEDS),
    "resnet50": Recipe("resnet50", ("resnet50",), IMAGE, seeds=FIVE_SEEDS),
    # Its head of 8 classes is drawn as at 1000 (workloads/vision/model.py: torchvision's fan-out draw started with
    # logits of standard deviation 4.5, and the held-out loss jumped 5-40x between seeds and epochs).
    "efficientnet-b0": Recipe(
        "efficientnet-b0",
        ("efficientnet-b0",),
        IMAGE,
        {"batch_size": 32},
        "efficientnet-b0 at the image recipe's batch of 16 ends its 80 steps with seeds far apart (held-out loss "
        "0.62, 1.49, 0.36 after epoch 4), a band reaching above ln 8 that would pass a network that learnt nothing; "
        "at batch 32 the seeds end together (0.18, 0.21, 0.16; seeds 3 and 7 at 0.16)",
        seeds=FIVE_SEEDS,
    ),
}
MODELS = tuple(model for recipe in REFERENCES.values() for model in recipe.models)
UNMATCHED = ("data_workers",)  # identity fields that never change the numbers
# Student's t quantile 0.995 by degrees of freedom (n seeds - 1): a two-sided 99% interval
T_995 = {
    1: 63.657,
    2: 9.925,
    3: 5.841,
    4: 4.604,
    5: 4.032,
    6: 3.707,
    7: 3.499,
    8: 3.355,
    9: 3.250,
    10: 3.169,
    12: 3.055,
    15: 2.947,
    20: 2.845,
    30: 2.750,
    60: 2.660,
}


def t_995(df: float) -> float:
    """Student's t quantile 0.995 at ``df`` degrees of freedom, read at the table's largest df not above it (so never
    smaller than the exact one: an interval no narrower than it should be); df of 1 or less read as 1."""
    return T_995[max((k for k in T_995 if k <= max(df, 1.0)), default=1)]


FLOOR = 0.01


@dataclass(frozen=True)
class Reference:
    """One model's reference: every seed's held-out loss per epoch, and the identity and recipe (its file's
    ``made.recipe``) a run must share."""

    model: str
    identity: dict[str, Any]
    trajectories: dict[int, list[float]]  # seed -> held-out loss after each epoch
    workload: str = "gpt"
    recipe: dict[str, Any] = field(default_factory=lambda: dict(RECIPE))

    @property
    def epochs(self) -> int:
        return min(len(t) for t in self.trajectories.values())

    def band(self, epoch: int | None = None) -> tuple[float, float]:
        """The 99% prediction interval of the held-out loss after ``epoch`` (counted from 1; default: the last)
        (module docstring)."""
        finals = [t[(epoch or self.epochs) - 1] for t in self.trajectories.values()]
        mean = statistics.fmean(finals)
        n = len(finals)
        spread = t_995(n - 1) * statistics.stdev(finals) * math.sqrt(1 + 1 / n) if n > 1 else 0.0
        half = max(spread, FLOOR * abs(mean))
        return mean - half, mean + half

    def means(self) -> list[float]:
        """The seeds' mean held-out loss after each epoch."""
        return [statistics.fmean(t[e] for t in self.trajectories.values()) for e in range(self.epochs)]

    @property
    def falls(self) -> bool:
        """Whether the mean held-out loss falls every epoch: a target only means something on a curve that falls."""
        means = self.means()
        return all(later < earlier for earlier, later in itertools.pairwise(means))

    def targets(self) -> dict[str, float]:
        """The named targets (``--target NAME``): ``ref-epochN`` is the upper end of the band after epoch N, the
        held-out loss a run that trains as the reference does reaches by its epoch N 99 times in 100. None where
        the reference's loss does not fall (docs/quality.md)."""
        if not self.falls:
            return {}
        return {f"ref-epoch{epoch}": self.band(epoch)[1] for epoch in range(1, self.epochs + 1)}

    def outside_epochs(self, val_losses: list[float | None]) -> list[int] | None:
        """The trajectory test: the epochs (from 1) after which the run's held-out loss lies outside that epoch's
        99% prediction interval (:meth:`band`); [] when every one lies within; None when the run did not measure
        every epoch of the reference. A run that trains as the reference does fails it at most 1% of the time per
        epoch, so at most 4% over 4 epochs, and less in practice: one run's losses after successive epochs move
        together."""
        if len(val_losses) < self.epochs or any(v is None for v in val_losses[: self.epochs]):
            return None
        outside = []
        for epoch in range(1, self.epochs + 1):
            low, high = self.band(epoch)
            loss = val_losses[epoch - 1]
            assert loss is not None
            if not low <= loss <= high:
                outside.append(epoch)
        return outside

    def seeds_test(self, finals: list[float]) -> tuple[float, float]:
        """The test over several seeds of the run under test (two or more): Welch's two-sample t-test of their
        held-out losses after the last epoch against the reference seeds', at 99% (two-sided), with the same 1%
        floor as the band. Returns (difference of the means, half-width): the runs differ from the reference when
        the difference's magnitude is above the half-width."""
        reference = [t[self.epochs - 1] for t in self.trajectories.values()]
        n, k = len(reference), len(finals)
        if k < 2:
            raise ValueError("the seeds' test needs two or more runs")
        difference = statistics.fmean(finals) - statistics.fmean(reference)
        var_r = statistics.variance(reference) / n if n > 1 else 0.0
        var_x = statistics.variance(finals) / k
        se = math.sqrt(var_r + var_x)
        if se == 0:
            return difference, FLOOR * abs(statistics.fmean(reference))
        welch = se**4 / ((var_r**2 / (n - 1) if n > 1 else 0.0) + var_x**2 / (k - 1))
        return difference, max(t_995(welch) * se, FLOOR * abs(statistics.fmean(reference)))

    def verdict(self, val_losses: list[float | None]) -> float | None:
        """The run's held-out loss after the reference's last epoch, if it trained that long and measured it."""
        if len(val_losses) < self.epochs:
            return None
        return val_losses[self.epochs - 1]


def load(folder: Path = REFERENCE_DIR) -> dict[str, Reference]:
    """The shipped references by model name (every ``<name>.json`` in ``folder``, each with the recipe it was made
    at; none where there is none). A model is in one file only: two recipes of one model would leave a run's
    named targets ambiguous, so a second one is refused."""
    references: dict[str, Reference] = {}
    for path in sorted(folder.glob("*.json")):
        raw = json.loads(path.read_text())
        recipe = dict(raw["made"]["recipe"])
        for model, entry in raw["models"].items():
            if model in references:
                raise ValueError(f"{path}: {model} has a reference in another file of {folder} too; keep one")
            trajectories = {
                int(seed): [float(v) for v in losses] for seed, losses in entry["trajectories"].items()
            }
            references[model] = Reference(
                model, entry["identity"], trajectories, str(recipe["workload"]), recipe
            )
    return references


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
        if targets
    )


def resolve_target(model: str, name: str, references: dict[str, Reference] | None = None) -> float:
    """The validation loss ``--target NAME`` stands for with ``--model model``; ValueError (naming what works)
    where the model has no reference or no target of that name."""
    references = load() if references is None else references
    targets = {m: t for m, t in named_targets(references).items() if t}
    if model in references and model not in targets:
        flat = ", ".join(f"{m:.3f}" for m in references[model].means())
        raise ValueError(
            f"--target {name}: the reference of {model} does not fall (its held-out loss after each epoch: {flat}), "
            "so it names no targets; give a validation loss with --target-loss X instead"
        )
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
    identity (its data workers aside), and the reference's own recipe's global batch, steps, learning rate and
    held-out batches (its file's ``made.recipe``) on generated data; precision, strategy and backend may differ (that is
    what the test is for)."""
    reference = references.get(str(config.get("model")))
    if reference is None or config.get("workload") != reference.workload or config.get("data") is not None:
        return None

    def matched(fields: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in fields.items() if k not in UNMATCHED}

    recipe = {**RECIPE, **reference.recipe}
    same = (
        int(config.get("batch_size", 0)) * data_parallel(config, world_size) == recipe["batch_size"]
        and config.get("steps_per_epoch") == recipe["steps_per_epoch"]
        and math.isclose(float(config.get("learning_rate", 0.0)), recipe["learning_rate"])
        and config.get("eval_batches") == recipe["eval_batches"]
        and matched(identity) == matched(reference.identity)
    )
    return reference if same else None


def data_parallel(config: dict[str, Any], world_size: int) -> int:
    """The replicas that each train on their own batch: every rank, less those a tensor or pipeline axis of the
    run's mesh gives the same batch (the global batch is the per-device batch times this). The expert axis is
    data-parallel here: each of its ranks trains its own batch and sends the tokens to the experts' ranks."""
    from accelbench.parallel_dims import generic_axis, parse_mesh

    mesh = config.get("mesh")
    if not mesh:
        return world_size
    split = 1
    for axis, size in parse_mesh(str(mesh)).items():
        if generic_axis(axis) not in ("dp", "ep"):
            split *= size
    return max(1, world_size // split)
