"""``compare --fleet``: the nodes of a cluster that ran the same benchmark, ranked, with the slow (and the
suspiciously fast) ones flagged and what in their environment could explain it.

A *benchmark* is one workload (the comparison's workload key) at one device count on one kind of device; a *node*
is a record's host. Each node's figure is the median of its successful runs' steady epoch times. Over the nodes of
a benchmark, robust statistics: the median, and the median absolute deviation (MAD) scaled by 1.4826 so that it
estimates a standard deviation where the times are normal; a mean and a standard deviation would be dragged by the
very nodes being looked for.

**The rule.** A node is an outlier when its time is more than :data:`OUTLIER_MADS` (3) scaled MADs from the
median *and* more than :data:`MIN_RELATIVE` (2%) from it: the floor keeps a fleet of near-identical nodes (a MAD
of almost nothing) from flagging differences no one would act on. It takes :data:`MIN_NODES` (3) nodes to say.

**What could explain it.** Every attribute of the outlier's environment (versions, driver, clocks, power limit,
kernel, NUMA layout, collective library, the environment variables the record keeps, host contention) whose value
none of the benchmark's typical nodes has.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from accelbench.compare.summary import RunSummary

OUTLIER_MADS = 3.0
MAD_TO_SIGMA = 1.4826  # MAD x this estimates the standard deviation of normally distributed values
MIN_RELATIVE = 0.02
MIN_NODES = 3


@dataclass(frozen=True)
class Node:
    """One node's runs of a benchmark: its median steady epoch time and its environment."""

    name: str
    epoch_s: float
    runs: int
    environment: dict[str, str]


@dataclass(frozen=True)
class Outlier:
    node: Node
    direction: str  # "slow" or "fast"
    mads: float  # distance from the median in scaled MADs (inf when the MAD is 0)
    differences: list[tuple[str, str, list[str]]]  # attribute, the node's value, the typical nodes' values


@dataclass
class FleetGroup:
    """The nodes of one benchmark, fastest first, with the median, the scaled MAD and the outliers."""

    benchmark: str
    nodes: list[Node]
    median_s: float
    mad_s: float  # scaled (x 1.4826)
    outliers: list[Outlier] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        flagged = {o.node.name: o for o in self.outliers}
        return {
            "benchmark": self.benchmark,
            "median_epoch_s": self.median_s,
            "scaled_mad_s": self.mad_s,
            "nodes": [
                {
                    "node": n.name,
                    "epoch_s": n.epoch_s,
                    "runs": n.runs,
                    "vs_median": n.epoch_s / self.median_s - 1,
                    "outlier": flagged[n.name].direction if n.name in flagged else None,
                }
                for n in self.nodes
            ],
            "outliers": [
                {
                    "node": o.node.name,
                    "direction": o.direction,
                    "mads": None if o.mads == float("inf") else o.mads,
                    "epoch_s": o.node.epoch_s,
                    "differences": [
                        {"attribute": a, "node": mine, "typical": theirs} for a, mine, theirs in o.differences
                    ],
                }
                for o in self.outliers
            ],
        }


def fleet(runs: Iterable[RunSummary]) -> tuple[list[FleetGroup], list[str]]:
    """The benchmarks that ran on at least :data:`MIN_NODES` nodes, each ranked, and a note for each that ran on
    fewer (too few nodes to tell an outlier)."""
    by_benchmark: dict[tuple[Any, ...], dict[str, list[RunSummary]]] = {}
    for run in runs:
        if not run.ok or run.figures is None or not run.figures.epoch_s:
            continue
        s = run.system
        key = (run.key, run.devices, s.backend, s.device)
        by_benchmark.setdefault(key, {}).setdefault(s.host, []).append(run)
    groups, notes = [], []
    for (key, devices, backend, device), by_node in by_benchmark.items():
        name = f"{key.describe(None)} · {devices} x {device} ({backend})"
        if len(by_node) < MIN_NODES:
            notes.append(
                f"{name}: {len(by_node)} node(s); a fleet needs {MIN_NODES} or more to tell an outlier"
            )
            continue
        groups.append(_rank(name, by_node))
    return groups, notes


def _rank(name: str, by_node: dict[str, list[RunSummary]]) -> FleetGroup:
    nodes = []
    for host, runs in by_node.items():
        epochs = [e for r in runs if r.figures is not None for e in r.figures.epoch_s]
        environment: dict[str, str] = {}
        for r in runs:  # a node's runs normally share one environment; where they do not, every value shows
            for attribute, value in (*r.environment, *r.node_facts):
                environment[attribute] = (
                    value
                    if environment.get(attribute, value) == value
                    else " | ".join(sorted({environment[attribute], value}))
                )
        nodes.append(Node(host, statistics.median(epochs), len(runs), environment))
    nodes.sort(key=lambda n: (n.epoch_s, n.name))
    median = statistics.median(n.epoch_s for n in nodes)
    mad = MAD_TO_SIGMA * statistics.median(abs(n.epoch_s - median) for n in nodes)
    group = FleetGroup(name, nodes, median, mad)
    flagged = [n for n in nodes if is_outlier(n.epoch_s, median, mad)]
    typical = [n for n in nodes if n not in flagged]
    for node in flagged:
        distance = abs(node.epoch_s - median)
        group.outliers.append(
            Outlier(
                node,
                "slow" if node.epoch_s > median else "fast",
                distance / mad if mad > 0 else float("inf"),
                differences(node, typical),
            )
        )
    group.outliers.sort(key=lambda o: -abs(o.node.epoch_s - median))
    return group


def is_outlier(value: float, median: float, scaled_mad: float) -> bool:
    """More than 3 scaled MADs and more than 2% from the median (see the module's docstring)."""
    distance = abs(value - median)
    return distance > OUTLIER_MADS * scaled_mad and distance > MIN_RELATIVE * median


def differences(node: Node, typical: Sequence[Node]) -> list[tuple[str, str, list[str]]]:
    """The attributes whose value on ``node`` no typical node has: (attribute, its value, the typical nodes'
    values, most common first). An attribute the typical nodes lack altogether counts too (``absent``)."""
    out = []
    attributes = list(node.environment) + sorted(
        {a for n in typical for a in n.environment} - set(node.environment)
    )
    for attribute in attributes:
        mine = node.environment.get(attribute, "absent")
        counts: dict[str, int] = {}
        for other in typical:
            value = other.environment.get(attribute, "absent")
            counts[value] = counts.get(value, 0) + 1
        if mine not in counts:
            out.append((attribute, mine, sorted(counts, key=lambda v: (-counts[v], v))))
    return out


def render_fleet(groups: Sequence[FleetGroup], notes: Sequence[str]) -> list[str]:
    """The fleet as text lines: each benchmark's nodes ranked, then its outliers and their differences."""
    lines: list[str] = []
    for group in groups:
        lines.append(
            f"{group.benchmark}: {len(group.nodes)} nodes, median epoch {group.median_s:.4g} s, scaled MAD "
            f"{group.mad_s:.3g} s ({group.mad_s / group.median_s:.1%})"
        )
        flagged = {o.node.name: o for o in group.outliers}
        width = max(len(n.name) for n in group.nodes)
        for i, node in enumerate(group.nodes, 1):
            mark = f"  << {flagged[node.name].direction}" if node.name in flagged else ""
            lines.append(
                f"  {i:>4}  {node.name:<{width}}  {node.epoch_s:.4g} s  {node.epoch_s / group.median_s - 1:+.1%}"
                f"  ({node.runs} run(s)){mark}"
            )
        for outlier in group.outliers:
            mads = "MAD 0" if outlier.mads == float("inf") else f"{outlier.mads:.1f} MADs"
            lines.append(
                f"  {outlier.direction} node {outlier.node.name}: {outlier.node.epoch_s / group.median_s - 1:+.1%} "
                f"against the median ({mads})"
            )
            if not outlier.differences:
                lines.append("    no environment difference recorded: look at the hardware (thermals, links)")
            for attribute, mine, theirs in outlier.differences:
                lines.append(f"    {attribute}: {mine}  (the typical nodes: {', '.join(theirs)})")
        lines.append("")
    lines += notes
    lines.append(
        f"outlier = a node whose median steady epoch time is more than {OUTLIER_MADS:g} scaled MADs (MAD x "
        f"{MAD_TO_SIGMA}) and more than {MIN_RELATIVE:.0%} from the benchmark's median over nodes; listed under it, "
        "each attribute of its environment that no typical node shares."
    )
    return lines
