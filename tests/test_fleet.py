"""``compare --fleet``: a simulated fleet (copies of one real record, one per node) with slow and fast nodes and
environment differences planted; compare flags exactly the planted nodes and names what differs on each."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from accelbench.cli import main
from accelbench.compare.fleet import differences, fleet, is_outlier
from accelbench.compare.records import load_records
from accelbench.results import ResultRecord

# each node's time against the fleet's (typical nodes within +-0.6%, the noise of a healthy fleet)
TYPICAL = [1.0, 0.996, 1.004, 0.998, 1.002, 1.006, 0.994, 1.001, 0.999]
SLOW_DRIVER, SLOW_CONTENDED, FAST = "node10", "node11", "node12"


def node_record(base: dict[str, Any], node: str, factor: float, i: int) -> dict[str, Any]:
    record = copy.deepcopy(base)
    record["run_id"] = f"{i:032x}"
    record["system"]["host"] = node
    for epoch in record["metrics"]["epochs"]:
        epoch["wall_s"] *= factor
        epoch["samples_per_s"] /= factor
        epoch["tokens_per_s"] /= factor
    record["backend"]["devices"][0]["details"]["driver"] = "550.90.07"
    record["backend"]["devices"][0]["details"]["uuid"] = f"GPU-{i}"  # differs on every node: never a reason
    record["system"]["os"] = "Linux 6.1.0-18-amd64"
    record["metrics"]["host"] = None
    return record


def write_fleet(base: ResultRecord, folder: Path) -> Path:
    """9 typical nodes, one of them (node05) on another driver at normal speed; node10 25% slower on an older
    driver; node11 15% slower on another kernel with a contended host; node12 30% faster with another torch."""
    raw = json.loads(base.to_json())
    records = [node_record(raw, f"node{i:02d}", f, i) for i, f in enumerate(TYPICAL, 1)]
    records[4]["backend"]["devices"][0]["details"]["driver"] = (
        "550.54.15"  # a difference that explains nothing
    )
    slow = node_record(raw, SLOW_DRIVER, 1.25, 10)
    slow["backend"]["devices"][0]["details"]["driver"] = "535.104.05"
    contended = node_record(raw, SLOW_CONTENDED, 1.15, 11)
    contended["system"]["os"] = "Linux 5.14.0-362-el9"
    contended["metrics"]["host"] = {
        "waiting": 0.31, "load_avg": 9.0, "steal": 0.18, "cores": 2, "contended": True, "contended_epochs": [1, 2],
        "threshold": 0.1, "note": "contended",
    }  # fmt: skip
    fast = node_record(raw, FAST, 0.7, 12)
    fast["system"]["torch_version"] = "2.9.0"
    folder.mkdir()
    for record in [*records, slow, contended, fast]:
        (folder / f"{record['system']['host']}.json").write_text(json.dumps(record))
    return folder


def test_the_planted_nodes_and_only_they_are_flagged_with_their_differences(
    tiny_run: tuple[ResultRecord, Path], tmp_path: Path
) -> None:
    folder = write_fleet(tiny_run[0], tmp_path / "fleet")
    groups, notes = fleet(load_records([folder]).records)
    assert notes == [] and len(groups) == 1
    group = groups[0]
    assert len(group.nodes) == 12 and group.nodes[0].name == FAST and group.nodes[-1].name == SLOW_DRIVER
    flagged = {o.node.name: o for o in group.outliers}
    assert set(flagged) == {SLOW_DRIVER, SLOW_CONTENDED, FAST}
    assert [o.node.name for o in group.outliers] == [FAST, SLOW_DRIVER, SLOW_CONTENDED]  # farthest first
    assert (flagged[SLOW_DRIVER].direction, flagged[FAST].direction) == ("slow", "fast")
    assert flagged[SLOW_DRIVER].differences == [("device driver", "535.104.05", ["550.90.07", "550.54.15"])]
    contended = {a: (mine, theirs) for a, mine, theirs in flagged[SLOW_CONTENDED].differences}
    assert set(contended) == {"os", "host contention"}
    assert contended["os"] == ("Linux 5.14.0-362-el9", ["Linux 6.1.0-18-amd64"])
    assert contended["host contention"][0] == (
        "contended (threads waited for a core 31% of the time; the hypervisor stole 18% of the cores' time)"
    )
    assert [a for a, _, _ in flagged[FAST].differences] == ["torch"]


def test_the_command_prints_the_ranking_the_rule_and_json(
    tiny_run: tuple[ResultRecord, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_fleet(tiny_run[0], tmp_path / "fleet")
    assert main(["compare", str(folder), "--fleet"]) == 0
    out = capsys.readouterr().out
    assert "12 nodes, median epoch" in out
    assert "<< slow" in out and f"slow node {SLOW_DRIVER}: +2" in out
    assert "device driver: 535.104.05  (the typical nodes: 550.90.07, 550.54.15)" in out
    assert "more than 3 scaled MADs (MAD x 1.4826) and more than 2%" in out
    assert main(["compare", str(folder), "--fleet", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (bench,) = data["benchmarks"]
    assert {o["node"] for o in bench["outliers"]} == {SLOW_DRIVER, SLOW_CONTENDED, FAST}
    assert [n["node"] for n in bench["nodes"]][-1] == SLOW_DRIVER


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--vs", "precision"],
            "--vs precision: --fleet ranks the nodes of each benchmark against their median",
        ),
        (["--format", "csv"], "--format csv: --fleet writes table, markdown or json"),
    ],
)
def test_fleet_refuses_what_it_cannot_do(
    tiny_run: tuple[ResultRecord, Path], args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(tiny_run[1]), "--fleet", *args]) == 2
    assert message in capsys.readouterr().err


def test_too_few_nodes_are_said_not_ranked(tiny_run: tuple[ResultRecord, Path]) -> None:
    groups, notes = fleet(load_records([tiny_run[1]]).records)
    assert groups == [] and "1 node(s); a fleet needs 3 or more" in notes[0]


def test_the_rule_needs_both_3_mads_and_2_percent() -> None:
    assert is_outlier(1.03, 1.0, 0.001)  # 30 MADs and 3%
    assert not is_outlier(1.01, 1.0, 0.001)  # 10 MADs but 1%: a near-identical fleet's noise
    assert not is_outlier(1.10, 1.0, 0.05)  # 10% but 2 MADs: a noisy fleet
    assert is_outlier(0.80, 1.0, 0.05)  # fast counts too


def test_differences_list_what_no_typical_node_has() -> None:
    from accelbench.compare.fleet import Node

    typical = [
        Node("a", 1, 1, {"driver": "1", "env X": "on"}),
        Node("b", 1, 1, {"driver": "2", "env X": "on"}),
    ]
    assert differences(Node("c", 2, 1, {"driver": "2"}), typical) == [("env X", "absent", ["on"])]
    assert differences(Node("d", 2, 1, {"driver": "3", "env X": "on"}), typical) == [
        ("driver", "3", ["1", "2"])
    ]
