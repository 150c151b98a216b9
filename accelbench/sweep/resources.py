"""What a sweep point asks of Slurm when ``sweep --submit slurm`` makes it a job: nodes, tasks and GPUs per node,
a time limit, a partition and account, and any further ``sbatch`` options.

They come from the sweep file's ``[slurm]`` table, then the command line's flags (which win); what neither gives is
taken from the point itself, so a DDP-scaling grid needs no table at all: ``--nodes`` is the point's ``nnodes``,
``--ntasks-per-node`` its ``devices`` (``srun`` starts one rank per device, and ``run`` refuses a ``--devices``
that disagrees with what srun started) and ``--gpus-per-node`` its ``devices`` on a GPU backend.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from accelbench.errors import ConfigError

SLURM_KEYS = ("nodes", "ntasks_per_node", "gpus_per_node", "time", "partition", "account", "sbatch_args")
GPU_BACKENDS = ("cuda", "rocm", "xpu")  # backends whose devices Slurm hands out as GPUs (gres/gpu)
# Slurm's --time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED
_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass(frozen=True)
class SlurmResources:
    """What one job asks for; ``None`` means "from the point" (nodes, tasks, GPUs) or "the partition's default"."""

    nodes: int | None = None
    ntasks_per_node: int | None = None
    gpus_per_node: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    sbatch_args: tuple[str, ...] = field(default_factory=tuple)

    def merged(self, other: SlurmResources) -> SlurmResources:
        """These resources with every value ``other`` sets replacing ours (flags over the file's table)."""
        changes: dict[str, Any] = {
            k: getattr(other, k) for k in SLURM_KEYS if k != "sbatch_args" and getattr(other, k) is not None
        }
        return replace(self, **changes, sbatch_args=self.sbatch_args + other.sbatch_args)

    def for_point(self, values: Mapping[str, Any]) -> SlurmResources:
        """The resources of one point: what was not given is derived from its ``nnodes``, ``devices`` and
        ``backend``."""
        devices = int(values.get("devices", 1))
        gpus = devices if str(values.get("backend", "")) in GPU_BACKENDS else 0
        return replace(
            self,
            nodes=self.nodes if self.nodes is not None else int(values.get("nnodes", 1)),
            ntasks_per_node=self.ntasks_per_node if self.ntasks_per_node is not None else devices,
            gpus_per_node=self.gpus_per_node if self.gpus_per_node is not None else gpus,
        )

    def directives(self) -> list[str]:
        """The ``#SBATCH`` options (without the prefix) these resources make."""
        out = []
        for flag, value in (
            ("--nodes", self.nodes),
            ("--ntasks-per-node", self.ntasks_per_node),
            ("--gpus-per-node", self.gpus_per_node or None),
            ("--time", self.time),
            ("--partition", self.partition),
            ("--account", self.account),
        ):
            if value is not None:
                out.append(f"{flag}={value}")
        return [*out, *self.sbatch_args]


def check_resources(raw: Mapping[str, Any], where: str) -> SlurmResources:
    """A ``[slurm]`` table (or the flags gathered into one), checked: ``where`` names it in errors."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a table of Slurm resources ({', '.join(SLURM_KEYS)})")
    unknown = [k for k in raw if k not in SLURM_KEYS]
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(SLURM_KEYS)}")
    values: dict[str, Any] = {}
    for key in ("nodes", "ntasks_per_node", "gpus_per_node"):
        value = raw.get(key)
        if value is None:
            continue
        least = 0 if key == "gpus_per_node" else 1
        if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= 100_000:
            raise ConfigError(
                f"{where}: {key} = {value!r}; give a whole number of at least {least}, or leave it out to take it "
                "from each point (nnodes, devices)"
            )
        values[key] = value
    time = raw.get("time")
    if time is not None:
        if not isinstance(time, str) or not _TIME.fullmatch(time.strip()):
            raise ConfigError(
                f"{where}: time = {time!r}; give a Slurm time limit such as 30 (minutes), 01:30:00 or 1-12:00:00"
            )
        values["time"] = time.strip()
    for key in ("partition", "account"):
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not _NAME.fullmatch(value):
            raise ConfigError(
                f"{where}: {key} = {value!r}; give a {key} name (letters, digits, '_', '-', '.'), as sinfo shows it"
            )
        values[key] = value
    args = raw.get("sbatch_args", ())
    if isinstance(args, str) or not isinstance(args, Sequence) or not all(isinstance(a, str) for a in args):
        raise ConfigError(
            f'{where}: sbatch_args = {args!r}; give a list of sbatch options, e.g. ["--exclusive", '
            '"--constraint=a100"]'
        )
    for arg in args:
        if not arg.startswith("-") or "\n" in arg:
            raise ConfigError(
                f"{where}: sbatch_args item {arg!r}; each is one sbatch option starting with '-', e.g. "
                "--exclusive or --qos=high"
            )
    values["sbatch_args"] = tuple(args)
    return SlurmResources(**values)
