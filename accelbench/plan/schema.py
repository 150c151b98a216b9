"""The plan as data (``accelbench plan --json``): schema ``accelbench.plan``, versioned like the result and estimate
records, so a script can read a ranking and a measured comparison without parsing tables."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PlannedRun(_Model):
    """One candidate configuration and its prediction."""

    label: str = Field(
        description="strategy, layout, batch/accumulation (/pipeline microbatches/schedule), precision and +ac "
        "(activation checkpointing), as the table shows them."
    )
    strategy: str
    layout: str = Field(description="dp x tp x pp sizes, e.g. 'dp2 tp1 pp1'.")
    mesh: str | None = None
    batch_size: int = Field(description="Samples per device (per replica under tp/pp) per optimizer step.")
    grad_accum: int
    microbatches: int | None = None
    pp_schedule: str | None = Field(default=None, description="The pipeline schedule, for a pp axis.")
    precision: str
    activation_checkpointing: bool = Field(
        default=False, description="Each layer's forward runs again in backward (--activation-checkpointing)."
    )
    global_batch: int = Field(description="Samples per optimizer step over the whole job.")
    options: dict[str, Any] = Field(description="The `accelbench run` options (RunConfig field -> value).")
    command: str = Field(description="The configuration as an `accelbench run` command line.")
    step_time_s: float | None
    samples_per_s: float | None
    time_to_budget_s: float | None = Field(
        default=None, description="--token-budget over the predicted rate."
    )
    peak_memory_bytes: float | None
    device_memory_bytes: int | None
    fits: bool | None
    reason: str | None = Field(default=None, description="Why it was dropped or left unpriced.")


class MeasuredRun(_Model):
    """One configuration of the top K, measured."""

    label: str
    predicted_rank: int
    measured_rank: int | None
    predicted_samples_per_s: float
    measured_samples_per_s: float | None
    measured_runs: int = Field(
        default=1, description="Runs that measured a throughput (--measure-repeats); the median is compared."
    )
    spread: float | None = Field(
        default=None, description="(fastest - slowest) / median over the runs; None for one run."
    )
    status: str = Field(description="The run's outcome: ok, oom, error, ... (the sweep's).")
    record: str | None = Field(default=None, description="The result record's file.")
    waited: float | None = Field(
        default=None,
        description="Share of ready time the run's threads waited for a core (its record's host).",
    )
    contended: bool = Field(
        default=False, description="The run found the host contended: its figures suspect."
    )


class Comparison(_Model):
    """Predicted against measured for the top K."""

    out: str = Field(description="The folder of the measured records (reused by a second --measure).")
    runs: list[MeasuredRun]
    spearman: float | None = Field(
        description="Spearman's rank correlation, predicted vs measured throughput."
    )
    top_pick_gap: float | None = Field(
        description="1 - measured(predicted top) / best measured: 0 when the predicted top was measured best."
    )
    top_pick_within_5pct: bool | None


class Plan(_Model):
    """The ranking of every candidate configuration for one model on one job shape."""

    schema_name: Literal["accelbench.plan"] = Field(default="accelbench.plan", alias="schema")
    schema_version: int = SCHEMA_VERSION
    workload: str
    model: str
    devices: int = Field(description="Devices per node.")
    nnodes: int
    device: str = Field(description="The device predicted for, and where its figures come from.")
    global_batch: int | None = None
    token_budget: float | None = None
    ranked_by: str = Field(
        description="samples/s (higher first), or the time to the token budget (lower first)."
    )
    candidates: int = Field(description="Configurations priced (ranked + dropped + unpriced).")
    ranked: list[PlannedRun] = Field(description="Predicted to fit, best first.")
    dropped: list[PlannedRun] = Field(description="Predicted not to fit the device's memory.")
    unpriced: list[PlannedRun] = Field(description="Step time unknown (e.g. no bus bandwidth): never ranked.")
    not_offered: dict[str, int] = Field(
        description="Combinations refused before pricing: reason -> how many."
    )
    assumptions: list[str] = Field(default_factory=list)
    comparison: Comparison | None = None

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)
