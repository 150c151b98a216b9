"""Is my bandwidth good? Each collective's bus bandwidth graded against the ceiling of the link it crossed.

The link is read from what detection recorded about the devices (``backend.devices[].details``): active NVLinks
and their version (NVML), xGMI links (AMD), the PCIe link's generation and width. Bus bandwidth (nccl-tests'
``busbw``) is comparable with one direction of a device's link, so every ceiling here is one direction's:

- **NVLink**: links x the per-link, per-direction rate of its version (:data:`NVLINK_GBPS`): 25 GB/s for NVLink
  2-4 (V100 6 links: 150; A100 12: 300; H100 18: 450), 50 GB/s for NVLink 5 (B200 18: 900);
- **xGMI**: links x :data:`XGMI_GBPS` of the device's architecture (MI250X 50 GB/s, MI300X 64 GB/s a link); where
  detection recorded which peers the links reach (``xgmi_peers``, ``ordinal:links``), only the links to the other
  devices of the job count (two of eight MI300X share one link, not seven);
- **PCIe**: lanes x the per-lane rate of the generation after line coding (:data:`PCIE_LANE_GBPS`: gen4 x16
  31.5 GB/s, gen5 x16 63 GB/s); the path through a switch or the CPU can only be slower;
- **one host without a device link** (gloo between CPU processes: loopback TCP and shared memory) and **across
  nodes** (the network, which detection does not read): no ceiling is known, and the grade says so rather than
  inventing one.

Small messages are bound by latency, not bandwidth, so a collective is graded by its peak bus bandwidth over the
sizes measured (what nccl-tests' plateau shows); :data:`GOOD` and :data:`FAR_BELOW` bound the words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from accelbench.comm.collectives import size_label
from accelbench.comm.records import CommMeasurement, CommRecord

NVLINK_GBPS = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}  # per link, per direction
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}  # per lane, per direction
# per link, per direction, by architecture: AMD's data sheets give one Infinity Fabric link's peak as bidirectional,
# 100 GB/s on the MI210 (3 links) and MI250X (8 links), 128 GB/s on the MI300X (7 links, 896 GB/s aggregate in an
# 8-GPU OAM platform); half of it flows each way
XGMI_GBPS = {"gfx90a": 50.0, "gfx942": 64.0}
GOOD = 0.70  # at least this share of the ceiling: good (NCCL reaches 80-90% of NVLink at large sizes)
FAR_BELOW = 0.40  # below this share: far below its ceiling


@dataclass(frozen=True)
class Link:
    """The link a job's collectives crossed and its one-direction ceiling (None: not known)."""

    name: str
    ceiling_gbps: float | None
    source: str  # where the ceiling comes from, or why there is none


@dataclass(frozen=True)
class Grade:
    op: str
    dtype: str
    busbw_gbps: float
    size_bytes: int
    link: Link
    share: float | None  # of the ceiling
    verdict: str  # good, fair, far below, or "no ceiling known"

    def describe(self) -> str:
        where = f"{self.op} {self.dtype}: peak bus bandwidth {self.busbw_gbps:.3g} GB/s at {size_label(self.size_bytes)}"
        if self.share is None or self.link.ceiling_gbps is None:
            return f"{where} over {self.link.name}: no ceiling known ({self.link.source})"
        text = f"{where} = {self.share:.0%} of {self.link.name}'s {self.link.ceiling_gbps:.4g} GB/s: {self.verdict}"
        if self.verdict == "far below":
            text += (
                " its ceiling; check that the collective backend uses the link (NCCL_DEBUG=INFO names the transport: "
                "P2P/NVLink or SHM over PCIe), the PCIe link's current generation and width, and larger --sizes"
            )
        return text


def _int(details: Mapping[str, str], key: str) -> int | None:
    try:
        value = int(details.get(key, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def _xgmi_links(details: Mapping[str, str], peers: set[int]) -> int | None:
    """A device's xGMI links to ``peers`` (the job's other devices) where detection named the peers each link
    reaches (``xgmi_peers``: ``1:4,2:1``), else every xGMI link it recorded (``xgmi_links``)."""
    named = details.get("xgmi_peers")
    if not named:
        return _int(details, "xgmi_links")
    try:
        reach = {int(peer): int(links) for peer, links in (item.split(":") for item in named.split(","))}
    except ValueError:
        return _int(details, "xgmi_links")
    return sum(links for peer, links in reach.items() if peer in peers) or None


def crossed_link(record: CommRecord) -> Link:
    """The link the job's collectives crossed, from the record's device details: NVLink, then xGMI, then PCIe,
    on one node; the network across nodes; loopback and shared memory for CPU processes on one host."""
    if record.nodes > 1:
        return Link("the network between nodes", None, "detection does not read the network's speed")
    used = record.backend.devices[: max(1, record.backend.devices_used)]
    if record.world_size < 2 or not used:
        return Link("no link (one rank)", None, "a single rank's collectives cross no link")
    details = [d.details for d in used]
    nvlinks = [_int(d, "nvlink_links") for d in details]
    if all(nvlinks):
        links = min(n for n in nvlinks if n)
        version = _int(details[0], "nvlink_version")
        per_link = NVLINK_GBPS.get(version or 0)
        if per_link is not None:
            return Link(
                f"NVLink {version} x{links}",
                links * per_link,
                f"{links} links x {per_link:g} GB/s a direction",
            )
        return Link(f"NVLink x{links}", None, f"NVLink version {version} is not in the ceiling table")
    ordinals = {device.index for device in used}
    xgmi = [_xgmi_links(device.details, ordinals - {device.index}) for device in used]
    if all(xgmi):
        links = min(n for n in xgmi if n)
        arch = (used[0].arch or "").split(":")[0]
        per_link = XGMI_GBPS.get(arch)
        if per_link is not None:
            return Link(
                f"xGMI x{links}", links * per_link, f"{links} links x {per_link:g} GB/s a direction ({arch})"
            )
        return Link(f"xGMI x{links}", None, f"architecture {arch or 'unknown'} is not in the xGMI table")
    generations = [_int(d, "pcie_generation") for d in details]
    widths = [_int(d, "pcie_width") for d in details]
    if all(generations) and all(widths):
        generation, width = min(g for g in generations if g), min(w for w in widths if w)
        lane = PCIE_LANE_GBPS.get(generation)
        if lane is not None:
            return Link(
                f"PCIe {generation}.0 x{width}", lane * width, f"{width} lanes x {lane:g} GB/s a direction"
            )
    if record.backend.info.name == "cpu" or record.backend.collective_backend == "gloo":
        return Link(
            "loopback and shared memory on one host",
            None,
            "gloo between processes of one host: bounded by memory copies and the loopback TCP stack, not a link",
        )
    return Link("an unknown link", None, "detection recorded no NVLink, xGMI or PCIe facts for these devices")


def grade_record(record: CommRecord) -> list[Grade]:
    """Each collective x type of ``record``, graded by its peak bus bandwidth over the sizes measured."""
    link = crossed_link(record)
    best: dict[tuple[str, str], CommMeasurement] = {}
    for m in record.measurements:
        if m.busbw_gbps is None or m.status != "ok":
            continue
        key = (m.op, m.dtype)
        if key not in best or m.busbw_gbps > (best[key].busbw_gbps or 0.0):
            best[key] = m
    grades = []
    for (op, dtype), m in best.items():
        busbw = m.busbw_gbps or 0.0
        share = busbw / link.ceiling_gbps if link.ceiling_gbps else None
        if share is None:
            verdict = "no ceiling known"
        elif share >= GOOD:
            verdict = "good"
        elif share >= FAR_BELOW:
            verdict = "fair"
        else:
            verdict = "far below"
        grades.append(Grade(op, dtype, busbw, m.size_bytes, link, share, verdict))
    return grades
