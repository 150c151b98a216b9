"""What differs between the environments of the systems compared: versions, effective precision, what one device is.

A comparison is only fair when the systems ran the same software the same way; listing the differences next to
the figures makes an unfair one visible (fp32 that ran as TF32 on one side, another torch, another launcher).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accelbench.compare.summary import RecordView, RunSummary

Environment = tuple[tuple[str, str], ...]  # (attribute, value), in a fixed order


def environment_of(record: RecordView) -> Environment:
    """The facts about a run's environment that can make a comparison unfair, flattened to strings."""
    s, b = record.system, record.backend
    env: dict[str, str] = {
        "accelbench": s.accelbench_version,
        "torch": s.torch_version
        + (f" (CUDA {s.torch_cuda})" if s.torch_cuda else "")
        + (f" (HIP {s.torch_hip})" if s.torch_hip else ""),
        "python": s.python,
        "os": s.os,
        "cpu": s.cpu_model,
        "backend": b.info.name + (f" ({b.distribution} {b.version})" if b.distribution else ""),
        "device": b.devices[0].name if b.devices else "none",
        "device unit": b.info.device_unit,
        "collective backend": b.collective_backend or "none",
        "torch threads": str(s.torch_threads),
        "engine": record.engine,
        "launcher": f"{record.launcher} ({record.world_size} processes on {record.nodes} node(s))",
        "scheduler": s.scheduler or "none",
    }
    for name, version in b.runtime_versions.items():
        env[f"runtime {name}"] = version
    for name, version in record.plugins.items():
        env[f"plugin {name}"] = version
    for name, value in s.environment.items():
        env[f"env {name}"] = value
    if record.precision:
        # keyed by the precision asked for: "fp32 that ran as TF32" on one side only is what must show
        p = record.precision
        env[f"precision {p.name}"] = (
            f"params {p.param_dtype}, autocast {p.autocast_dtype or 'off'}, matmul {p.matmul_math}, "
            f"loss scaling {p.loss_scaling}"
        )
    if record.executor:
        env["torch.compile"] = str(record.executor.get("torch_compile"))
        env["optimizer"] = (
            f"{record.executor.get('optimizer')} (fused: {record.executor.get('fused_optimizer')})"
        )
    if record.workload.get("attention"):
        env["attention"] = str(record.workload["attention"])
    if record.metrics and record.metrics.memory:
        env["memory measured"] = record.metrics.memory.source
    if record.metrics and record.metrics.peak:
        env["peak figure"] = record.metrics.peak.source
    return tuple(env.items())


def environment_differences(
    labelled: Sequence[tuple[str, RunSummary]], systems: Sequence[str]
) -> list[tuple[str, dict[str, list[str]]]]:
    """Attributes whose values differ between the systems that have them (or vary within one), with each system's
    values. An attribute only some systems have (a GPU driver, the plan of a precision only one system ran) is
    not a difference by itself."""
    # runs of one system mostly share one environment (the summaries share the very tuple): look at each once
    distinct: dict[tuple[str, int], tuple[str, Environment]] = {}
    for label, r in labelled:
        distinct.setdefault((label, id(r.environment)), (label, r.environment))
    values: dict[str, dict[str, list[str]]] = {}
    for label, environment in distinct.values():
        for attribute, value in environment:
            seen = values.setdefault(attribute, {}).setdefault(label, [])
            if value not in seen:
                seen.append(value)
    differing = []
    for attribute, by_system in values.items():
        per_system = [tuple(sorted(by_system[s])) for s in systems if s in by_system]
        if len(set(per_system)) > 1 or any(len(v) > 1 for v in per_system):
            differing.append((attribute, {s: sorted(by_system.get(s, [])) for s in systems}))
    return differing


# attributes that may differ between runs of one system without making them different variants of it: where the
# figures were read from, and which of several identical devices a job was given
_NOT_A_VARIANT = ("memory measured", "peak figure", "scheduler")
_DEVICE_SELECTION = ("VISIBLE_DEVICES", "AFFINITY_MASK", "DEVICE_SELECTOR")


def _makes_a_variant(attribute: str) -> bool:
    if attribute in _NOT_A_VARIANT:
        return False
    return not (attribute.startswith("env ") and attribute.endswith(_DEVICE_SELECTION))


def split_variants(labelled: Sequence[tuple[str, RunSummary]]) -> list[tuple[str, RunSummary]]:
    """Runs of one system label at one device count whose environments differ (other threads, launcher,
    collective backend, versions) are variants of the system, not one: each gets the label with what sets it
    apart (``vm · cpu [torch threads 1]``), so that their figures are never pooled into one cell."""
    envs: dict[tuple[str, int], dict[int, Environment]] = {}
    for label, r in labelled:
        envs.setdefault((label, r.devices), {}).setdefault(id(r.environment), r.environment)
    names: dict[tuple[str, int, int], str] = {}
    for (label, devices), by_id in envs.items():
        if len(by_id) < 2:
            continue
        seen: dict[str, set[str]] = {}
        for environment in by_id.values():
            for attribute, value in environment:
                seen.setdefault(attribute, set()).add(value)
        differing = [a for a, values in seen.items() if len(values) > 1 and _makes_a_variant(a)]
        if not differing:
            continue
        for env_id, environment in by_id.items():
            values = dict(environment)
            apart = ", ".join(f"{a} {values[a]}" for a in differing if a in values)
            names[label, devices, env_id] = f"{label} [{apart}]" if apart else label
    if not names:
        return list(labelled)
    return [(names.get((label, r.devices, id(r.environment)), label), r) for label, r in labelled]
