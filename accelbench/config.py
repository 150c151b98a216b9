"""The run configuration: everything that defines a benchmark point, validated before anything starts."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from accelbench.precision import PRECISIONS


class RunConfig(BaseModel):
    """One benchmark run. Stored whole in the result record, so a run can be repeated from it."""

    model_config = ConfigDict(extra="forbid")

    backend: str | None = Field(default=None, description="Backend name; None = detect by priority.")
    workload: str = "gpt"
    engine: Literal["native", "lightning"] = Field(
        default="native",
        description="'native': accelbench's loop; 'lightning': the same through Lightning Fabric.",
    )
    model: str = Field(default="gpt-nano", description="Size name from the workload's table, or 'custom'.")
    n_layer: int | None = Field(default=None, gt=0)
    n_head: int | None = Field(default=None, gt=0)
    n_embd: int | None = Field(default=None, gt=0)
    block_size: int = Field(default=128, gt=0)
    batch_size: int = Field(default=64, gt=0)
    epochs: int = Field(
        default=2, gt=0, description="Epoch 1 is the warm-up; later epochs are the steady state."
    )
    steps_per_epoch: int | None = Field(
        default=None, gt=0, description="Cap on steps per epoch (quick runs); None = the full epoch."
    )
    precision: str = "fp32"
    strategy: str = "single"
    devices: int = Field(default=1, gt=0, description="Devices (worker processes) per node.")
    nnodes: int = Field(default=1, gt=0, description="Nodes in the job.")
    node_rank: int = Field(default=0, ge=0)
    rdzv_endpoint: str | None = Field(default=None, description="HOST:PORT of the rendezvous (multi-node).")
    collective_timeout: float = Field(
        default=600.0,
        gt=0,
        description="Seconds a collective may wait for a peer before the run ends with an error.",
    )
    seed: int = 0
    data: Path | None = Field(default=None, description="Text file to train on; None = the generated corpus.")
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    learning_rate: float = Field(default=3e-4, gt=0.0)
    compile: bool = Field(default=False, description="torch.compile the model; compile time is timed apart.")
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = Field(
        default="default",
        description="torch.compile mode (with --compile); reduce-overhead replays the step as CUDA graphs.",
    )
    data_placement: Literal["auto", "host", "device"] = Field(
        default="auto",
        description="Where batches are made: 'device' keeps the corpus on the accelerator and gathers windows "
        "there (no copy per step); 'host' gathers with numpy and copies each batch; 'auto' = device on "
        "accelerators for corpora up to 2 GiB.",
    )
    vocab_multiple: int = Field(
        default=64,
        gt=0,
        description="Pad the embedding and head rows to a multiple of this (aligned tensor-core shapes); the "
        "padded logits are dropped before the loss, so the model computes the same function.",
    )
    threads: int | None = Field(default=None, gt=0, description="torch intra-op threads (CPU).")
    peak_tflops: float | None = Field(
        default=None, gt=0.0, description="Peak TFLOP/s per device for MFU, overriding the backend's table."
    )
    output_dir: Path = Path("results")
    backend_options: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="Options declared by plugins (accelbench_run_options), e.g. IPU replication; by option name.",
    )

    @field_validator("precision")
    @classmethod
    def _known_precision(cls, value: str) -> str:
        if value not in PRECISIONS:
            raise ValueError(f"unknown precision {value!r}; choose one of: {', '.join(PRECISIONS)}")
        return value

    @model_validator(mode="after")
    def _custom_sizes_complete(self) -> RunConfig:
        given = [v is not None for v in (self.n_layer, self.n_head, self.n_embd)]
        if self.model == "custom" and not all(given):
            raise ValueError("model 'custom' needs all of --layers, --heads and --embd")
        if any(given) and self.model != "custom":
            raise ValueError("--layers/--heads/--embd describe a custom size: use them with --model custom")
        if self.n_head and self.n_embd and self.n_embd % self.n_head:
            raise ValueError(f"embedding {self.n_embd} is not divisible by heads {self.n_head}")
        if self.compile_mode != "default" and not self.compile:
            raise ValueError(f"--compile-mode {self.compile_mode} needs --compile")
        return self


class RunOption(BaseModel):
    """A ``run`` option a plugin adds (``accelbench_run_options``): ``--NAME VALUE`` lands in
    ``RunConfig.backend_options[NAME]`` (with ``-`` in NAME as ``_``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Flag name without dashes, e.g. 'replicas' for --replicas.")
    type: Literal["str", "int", "float", "bool"] = "str"
    default: str | int | float | bool | None = None
    help: str = ""
    backend: str = Field(description="The backend that reads it; shown in --help.")
