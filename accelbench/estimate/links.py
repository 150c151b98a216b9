"""Collectives on a machine nobody here measured: alpha-beta over the device's links.

Where ``accelbench comm`` records exist (``--comm``) the collectives are read from them
(:class:`accelbench.estimate.comm.BusBandwidth`: the measured bus bandwidth at each message size, latency included).
For a device named from a catalogue (``--device``) with none, its plugin's link table prices them: each call costs a
latency plus its bus bytes over the bus bandwidth of the level it crosses,

    t(call) = alpha(op, ranks, nodes) + bus_bytes(call) / beta

with a ring's steps as NCCL's own tuning model counts them (``src/graph/tuning.cc``): p-1 steps for an all-gather or a
reduce-scatter, 2(p-1) for an all-reduce, of which (nodes-1), or 2(nodes-1), cross the network. alpha is a
protocol's base latency plus a latency per step over the link it crosses; NCCL picks per call the protocol that
finishes first, and so does this model: LL (low latency, a quarter of the bus bandwidth for an all-reduce or across
nodes, a third otherwise) or Simple (the whole bus bandwidth). The latencies are that file's (NCCL 2.18's values):
base 6.6 us (LL) and 8.4 us (Simple); per step 0.47 / 3.4 us over NVLink, 1.0 / 5.7 us over PCIe, 2.7 / 9.6 us over
the network.

beta inside a node is the link's one-way bandwidth per device (NVLink 4: 450 GB/s a GPU); across nodes it is the
node's network bandwidth (a NIC per device in NVIDIA's DGX reference systems, each ring crossing the network on its
own NIC), never above the bandwidth inside the node. A plugin gives its devices' figures in their catalogue details:
``link`` ("nvlink" or "pcie"), ``link_gbps`` (one-way GB/s a device), ``network_gbps`` (one-way GB/s of network a
device, as the reference system has), ``node_devices`` (the reference system's devices a node), with ``link_name``
and ``network_name`` to say what they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from accelbench.estimate.hardware import Bandwidth

# NCCL's tuning model (src/graph/tuning.cc, ring algorithm): base latency by protocol, latency per ring step by
# hardware and protocol, in microseconds
BASE_LATENCY_US = {"LL": 6.6, "Simple": 8.4}
STEP_LATENCY_US = {
    "nvlink": {"LL": 0.47, "Simple": 3.4},
    "pcie": {"LL": 1.0, "Simple": 5.7},
    "network": {"LL": 2.7, "Simple": 9.6},
}
# the bus bandwidth's share a protocol reaches (LL moves 8 bytes of which 4 are data, in flag-checked lines)
LL_SHARE_REDUCING, LL_SHARE_GATHERING = 1 / 4, 1 / 3
RING_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "sendrecv")
NCCL_TUNING = "NCCL's tuning model (src/graph/tuning.cc): ring latencies per protocol and step"


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus bytes per byte of the whole array: 2(p-1)/p for an all-reduce, (p-1)/p for an all-gather,
    reduce-scatter or all-to-all, 1 for the rest."""
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    return 1.0


def ring_steps(op: str, ranks: int) -> int:
    """The steps of a ring collective over ``ranks``: 2(p-1) for an all-reduce, p-1 for a gather or a scatter, p
    otherwise (NCCL's count)."""
    if op == "all_reduce":
        return 2 * (ranks - 1)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return ranks - 1
    return ranks


@dataclass(frozen=True)
class LinkTable(Bandwidth):
    """The collectives' cost over a device's links: alpha-beta per call (see the module's docstring).
    ``devices_per_node`` is how many of the job's devices share a node: a group of more crosses the network."""

    link: str  # "nvlink" or "pcie"
    link_bytes_per_s: float
    devices_per_node: int
    network_bytes_per_s: float | None = None
    link_name: str = ""
    network_name: str = ""

    def call_time(self, op: str, ranks: int, message_bytes: float) -> tuple[float, str]:
        """(seconds one call of ``op`` over ``ranks`` moving a ``message_bytes`` array takes, the protocol that
        wins)."""
        if ranks <= 1:
            return 0.0, "none"
        nodes = -(-ranks // self.devices_per_node)
        steps = ring_steps(op, ranks)
        inter = (2 * (nodes - 1) if op == "all_reduce" else nodes - 1) if nodes > 1 else 0
        beta = self.bus_bytes_per_s(nodes)
        bus = bus_factor(op, ranks) * message_bytes
        best: tuple[float, str] | None = None
        for protocol in ("LL", "Simple"):
            latency = BASE_LATENCY_US[protocol] + (steps - inter) * STEP_LATENCY_US[self.link][protocol]
            latency += inter * STEP_LATENCY_US["network"][protocol]
            share = 1.0
            if protocol == "LL":
                share = (
                    LL_SHARE_REDUCING if nodes > 1 or op in ("all_reduce", "reduce") else LL_SHARE_GATHERING
                )
            seconds = latency * 1e-6 + bus / (beta * share)
            if best is None or seconds < best[0]:
                best = (seconds, protocol)
        assert best is not None
        return best

    def bus_bytes_per_s(self, nodes: int) -> float:
        """beta: the link's bandwidth inside a node; across nodes the node's network (a NIC's share per device,
        times the devices a node has), never above the link's."""
        if nodes <= 1:
            return self.link_bytes_per_s
        if self.network_bytes_per_s is None:
            raise ValueError("no network bandwidth")
        return min(self.link_bytes_per_s, self.network_bytes_per_s * self.devices_per_node)

    def lookup(self, op: str, ranks: int, message_bytes: float, dtype: str) -> tuple[float, str] | None:
        """The effective bus bandwidth of a call: its bus bytes over its alpha-beta time (what dividing the step's
        bus bytes by it turns back into calls x time a call)."""
        nodes = -(-ranks // self.devices_per_node) if ranks > 1 else 1
        if nodes > 1 and self.network_bytes_per_s is None:
            return None
        seconds, protocol = self.call_time(op, ranks, message_bytes)
        bus = bus_factor(op, ranks) * message_bytes
        if seconds <= 0 or bus <= 0:
            return None
        level = (
            f"{self.network_name or 'network'} across {nodes} nodes"
            if nodes > 1
            else self.link_name or self.link
        )
        return bus / seconds, (
            f"link table: {level}, {self.bus_bytes_per_s(nodes) / 1e9:g} GB/s bus, {seconds * 1e6:.1f} us a call "
            f"({protocol}; alpha-beta, {NCCL_TUNING})"
        )


def link_table(details: Mapping[str, str], devices: int, nnodes: int = 1) -> LinkTable | None:
    """The link table a catalogued device's details give (see the module's docstring) for a job of ``devices`` a
    node over ``nnodes`` nodes, or None where they give none (communication time then unknown unless --comm or
    --bus-bandwidth is given). A job on one node counts the reference system's node (``node_devices``) as a node,
    so that a prediction scaled past it (--scale-to) crosses the network. Figures no link has are refused with
    ValueError (a plugin's fault, caught by the kit)."""
    devices_per_node = devices if nnodes > 1 else max(devices, int(details.get("node_devices", devices)))
    link, gbps = details.get("link"), details.get("link_gbps")
    if link is None or gbps is None:
        return None
    if link not in ("nvlink", "pcie"):
        raise ValueError(f"link {link!r}: give 'nvlink' or 'pcie'")
    network = details.get("network_gbps")
    figures = [float(gbps)] + ([float(network)] if network is not None else [])
    if any(not 0.1 <= f <= 10_000 for f in figures):
        raise ValueError(f"link figures {figures} GB/s: no link has them (give one-way GB/s a device)")
    return LinkTable(
        link=link,
        link_bytes_per_s=float(gbps) * 1e9,
        devices_per_node=max(1, devices_per_node),
        network_bytes_per_s=float(network) * 1e9 if network is not None else None,
        link_name=details.get("link_name", ""),
        network_name=details.get("network_name", ""),
    )
