"""`accelbench estimate` against real runs: predicted peak memory, step time and 1 -> 2 process speedup on this CPU.

    python benchmarks/estimate_vs_measured.py [--models gpt-micro gpt-mini] [--batch-size 16]
        [--strategies ddp fsdp deepspeed-zero1 deepspeed-zero2 deepspeed-zero3 tp pp] [--steps 6] [--epochs 4]
        [--gpt2] [--comm DIR] [--repeats R] [--out DIR] [--json FILE]

For each model it runs `accelbench run` once on one process (strategy single) and once per strategy on two
processes, fp32, a few short epochs, every process with one intra-op thread (--threads), so that a "device" is one
core in every run and 1 -> 2 processes doubles the devices (two threads per process on two shared cores stall at
OpenMP barriers whenever another job takes a core), and reads the records. The
predictions are made the way `accelbench estimate` makes them, from what was measured apart from those runs, never
fitted to them:

- peak FLOP/s: `accelbench estimate`'s measured dense-matmul peak (accelbench.estimate.peak) at the thread count
  each run's processes get, cached; default efficiency (0.4);
- beside it, the calibrated step time (`accelbench estimate --calibrate`): this CPU's calibration at that thread
  count (accelbench.estimate.calibration: matmul rates by shape, elementwise bandwidth, dispatch cost; cached) over
  the step's traced operators (accelbench.estimate.operators);
- FSDP2's hooks' cost on this host (accelbench.estimate.engine_cost: per unit, per parameter tensor and per step,
  from FSDP2 against a plain loop on units of tiny layers on one rank; cached), where FSDP is among the strategies;
- DeepSpeed ZeRO-3's engine cost on this host (accelbench.estimate.engine_cost: its hooks and per-tensor
  bookkeeping, per module, per parameter tensor and per step, from ZeRO-3 against a plain loop on stacks of tiny
  layers on one rank; cached), where ZeRO-3 is among the strategies;
- bus bandwidth: an `accelbench comm` record of all_reduce, all_gather and reduce_scatter over 2 gloo processes
  (measured here unless --comm names one), each also timed as a step meets it (`--in-step 5,20,80`: after that
  many milliseconds of compute on both ranks, the wait for the slower rank included), which is what the
  prediction prices the collectives at (`--isolated-comm`: at their bus bandwidth alone, as before), and in bursts
  of 16 calls back to back (`--burst 16`), which ZeRO-3's gathers of its persistent tensors are priced at;
  measured twice unless --comm names one, before the runs and after them, and the two pooled (each call's time in
  a step the mean of the two records'): on this shared VM the same call's in-step time moved 1.2 to 2.9 ms
  within the hour;
- the runtime a process holds besides its model (the CPU backend's peak is the resident-set high-water mark, which
  counts the interpreter, torch and its libraries): measured in a fresh interpreter that imports what a worker
  imports (joins a one-rank gloo group, imports DeepSpeed, for the strategies that do) and trains gpt-nano at
  batch 1 for three steps, so that what a first step initialises is counted.

--repeats R runs every configuration R times, in R rounds one after the other (each round every configuration
once), with a comm record before the first round, between rounds and after the last, all pooled: each measured
figure is then the median of a configuration's R runs, and the table adds each step's spread over its runs
((slowest - fastest) / median), the measurement's own noise a prediction's error is to be read against.
Before each round the calibration is spot-checked as `accelbench run` checks an hour-old one, and measured again where
the CPU runs more than 5% from it twice running; each run is priced from its round's calibration (the JSON's
"rounds" says which).

Prints one table of predicted against measured figures with the relative errors (the calibrated step also against
the step's CPU time, the time rank 0's threads ran, which a busy host's waiting leaves out), and the host contention
each run recorded (this machine is shared: a contended run's times say little). --json writes everything for docs/estimate.md.
--gpt2 adds gpt2 at batch 2 (about a second and a half per step per process here).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

STRATEGIES = ["ddp", "fsdp", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3"]
# tensor and pipeline parallelism over the two processes (not run unless named: --strategies tp pp)
MODEL_PARALLEL = ["tp", "pp"]

# What a worker process holds besides its model: the modules the runner imports, the plugin host, the generated
# corpus, a gloo group for the distributed strategies, DeepSpeed for its strategies, and what the first training
# steps initialise (autograd's engine, oneDNN, the optimizer), here with the smallest model, gpt-nano at batch 1
# (its own state, ~1.5 MiB, is counted in).
RUNTIME_PROBE = r"""
import sys
import torch
import accelbench.engine.runner, accelbench.engine.distributed
from accelbench.plugins import get_host
from accelbench.workloads.gpt.data import CharCorpus
get_host().select_backend("cpu")
corpus = CharCorpus.generated()
torch.set_num_threads(int(sys.argv[1]))
if sys.argv[2] != "single":
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
if sys.argv[2].startswith("deepspeed"):
    import deepspeed, accelbench.engine.deepspeed
from accelbench.config import RunConfig
host = get_host()
config = host.resolve(RunConfig(model="gpt-nano", batch_size=1))
job = host.workload("gpt").build(config)
model = job.model.train()
optimizer = job.make_optimizer(model, torch.device("cpu"), "fused")
inputs, targets = next(iter(job.data.batches(0, 0, 1)))
for _ in range(3):  # autograd, oneDNN and the optimizer initialised, as after a run's first step
    model(inputs, targets).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"):
        print(int(line.split()[1]) * 1024)
"""


def runtime_bytes(threads: int, strategy: str) -> int:
    """The resident memory of a fresh worker-like interpreter (median of three)."""
    values = []
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-c", RUNTIME_PROBE, str(threads), strategy],
            capture_output=True,
            text=True,
            check=True,
        )
        values.append(int(out.stdout.strip().splitlines()[-1]))
    return sorted(values)[1]


IN_STEP_MS = "5,20,80"  # the compute before each in-step call: FSDP's units to DDP's whole step, on this CPU
BURST = 16  # calls a burst is timed in (--burst): ZeRO-3 gathers its persistent tensors one call each, back to back


def comm_record(folder: Path) -> Path:
    """Measure all_reduce, all_gather and reduce_scatter over two gloo processes with `accelbench comm`."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "accelbench.cli", "comm", "--devices", "2", "--ops",
         "all_reduce,all_gather,reduce_scatter", "--dtypes", "fp32", "--min-bytes", "16KiB", "--max-bytes",
         "64MiB", "--factor", "4", "--iters", "10", "--warmup", "3", "--in-step", IN_STEP_MS, "--burst",
         str(BURST), "--output-dir", str(folder), "-q"],
        check=True,
    )  # fmt: skip
    return folder


def run(model: str, strategy: str, devices: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One real run; its record as JSON."""
    cmd = [sys.executable, "-m", "accelbench.cli", "run", "--model", model, "--batch-size",
           str(args.batch_size if model != "gpt2" else args.gpt2_batch), "--strategy", strategy, "--devices",
           str(devices), "--epochs", str(args.epochs), "--steps-per-epoch", str(args.steps), "--output-dir",
           str(out), "--precision", "fp32", "--threads", str(args.threads), "--json", "-q"]  # fmt: skip
    cmd += ["--activation-checkpointing"] if args.activation_checkpointing else []
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
    record: dict[str, Any] = json.loads(done.stdout)
    return record


def measured(record: dict[str, Any]) -> dict[str, Any]:
    m = record["metrics"]
    steps = m["epochs"][-1]["steps"]
    steady = m["epochs"][1:] or m["epochs"]
    cpu = sorted(e["cpu_s"] / e["steps"] for e in steady if e.get("cpu_s") is not None)
    return {
        "step_s": m["steady"]["epoch_s_median"] / steps,
        # the time its threads ran (rank 0's process), without the time they waited for a core: on a shared host
        # the closer figure to what a step costs a quiet one (its caches still shared)
        "cpu_step_s": cpu[len(cpu) // 2] if cpu else None,
        "samples_per_s": m["steady"]["samples_per_s"],
        "peak_bytes": m["peak_memory_max_bytes"],
        # the live tensor peak of one untimed step after the epochs (torch's MemTracker; None where the executor
        # exposes no plain model and optimizer, as DeepSpeed's): tensors, what the model predicts
        "tensor_peak_bytes": (m.get("tensor_peak") or {}).get("peak_bytes"),
        "waiting": m["host"]["waiting"] if m.get("host") else None,
        "contended": m["host"]["contended"] if m.get("host") else None,
    }


def middle(values: list[float]) -> float:
    """The median of ``values``, the upper of the middle two for an even count: a figure some run measured."""
    return sorted(values)[len(values) // 2]


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A configuration's measured figures over its repeated runs (:func:`measured` of each): each the median of
    the runs' (the upper of the middle two for an even count: a figure some run measured), and the step's spread,
    (slowest - fastest) / median."""
    combined: dict[str, Any] = {}
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] is not None]
        combined[key] = middle(values) if values else None
    steps = [r["step_s"] for r in runs]
    combined["step_spread"] = (max(steps) - min(steps)) / combined["step_s"] if len(steps) > 1 else None
    combined["steps_s"] = steps
    return combined


def predicted(
    record: dict[str, Any], runtime: int, bandwidth: Any, peaks: dict[int, Any], calibrations: dict[int, Any]
) -> dict[str, Any]:
    """The prediction for the run's own configuration, made as `accelbench estimate` makes it, at the efficiency
    and (``calibrated_*``) as `accelbench estimate --calibrate` makes it."""
    from accelbench.config import RunConfig
    from accelbench.contract import DeviceInfo, standard_plan
    from accelbench.estimate import predict
    from accelbench.estimate.facts import meta_facts
    from accelbench.estimate.operators import step_operators
    from accelbench.plugins import get_host

    config = RunConfig.model_validate(record["config"])
    threads = int(record["system"]["torch_threads"])
    workload = get_host().workload(config.workload)
    facts = meta_facts(workload, config)
    device = DeviceInfo.model_validate(record["backend"]["devices"][0])
    p = predict(config, facts, device_type="cpu", device=device, peak=peaks[threads], bandwidth=bandwidth,
                runtime_bytes=runtime)  # fmt: skip
    kernels = record["executor"].get("optimizer_implementation") or "fused"
    operators = step_operators(workload, config, standard_plan(config.precision, "ieee-fp32"), "cpu", kernels)
    c = predict(config, facts, device_type="cpu", device=device, peak=peaks[threads], bandwidth=bandwidth,
                runtime_bytes=runtime, calibration=calibrations[threads], operators=operators)  # fmt: skip
    return {
        "calibrated_step_s": c.step_time_s,
        "calibrated_forward_s": c.forward_s,
        "calibrated_backward_s": c.backward_s,
        "calibrated_optimizer_s": c.optimizer_s,
        "calibrated_dispatch_s": c.dispatch_s,
        "calibrated_engine_s": c.engine_s,
        "calibrated_samples_per_s": c.samples_per_s,
        "step_s": p.step_time_s,
        "compute_s": p.compute_s,
        "comm_s": p.comm_exposed_s,
        "optimizer_s": p.optimizer_s,
        "samples_per_s": p.samples_per_s,
        "peak_bytes": p.peak_memory_bytes,
        "runtime_bytes": runtime,
        "memory": p.memory.model_dump(),
        "comm_bytes": p.comm_bytes_per_step,
        "flops": p.flops_per_step,
        "threads": threads,
        "peak_flops_per_s": p.peak_flops_per_s,
    }


def error(pred: float | None, meas: float | None) -> float | None:
    return None if pred is None or not meas else (pred - meas) / meas


def priced_strategies(previous: dict[str, Any] | None, named: list[str]) -> list[str]:
    """The strategies whose engine costs the calibration carries: a reading's own under --again (whatever
    --strategies says), else those named."""
    return sorted({row["strategy"] for row in previous["rows"]}) if previous else named


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt-micro", "gpt-mini"])
    parser.add_argument(
        "--strategies",
        nargs="+",
        default=STRATEGIES,
        choices=STRATEGIES + MODEL_PARALLEL,
        help="the two-process strategies (each model also runs single, on one process); tp and pp (1F1B, two "
        "microbatches) only when named",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--gpt2", action="store_true", help="add gpt2 (batch --gpt2-batch)")
    parser.add_argument("--gpt2-batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6, help="steps per epoch")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads of every process (default 1: one process is one core, the unit 2 processes double)",
    )
    parser.add_argument("--epochs", type=int, default=4, help="epochs (the first is the warm-up)")
    parser.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="every run with --activation-checkpointing (each layer's forward again in backward)",
    )
    parser.add_argument(
        "--comm",
        type=Path,
        help="comm records to read instead of measuring (with --again: instead of its record)",
    )
    parser.add_argument(
        "--isolated-comm",
        action="store_true",
        help="price the collectives at their bus bandwidth timed alone, not as a step meets them (--in-step)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="rounds of every configuration, a comm record between rounds; each figure the median of its runs",
    )
    parser.add_argument("--out", type=Path, help="where records go (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="write the table's data here")
    parser.add_argument(
        "--refresh-peak", action="store_true", help="measure the matmul peaks again (not cached)"
    )
    parser.add_argument(
        "--refresh-calibration", action="store_true", help="measure the calibration again (not cached)"
    )
    parser.add_argument(
        "--again",
        type=Path,
        metavar="JSON",
        help="predict again for the runs a previous --json file lists (their records, comm record, runtimes and "
        "the cached peaks), without running anything",
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give 1 or more rounds")
    previous = json.loads(args.again.read_text()) if args.again else None
    strategies = priced_strategies(previous, args.strategies)

    import torch

    from accelbench.contract import World, standard_plan
    from accelbench.estimate.calibration import calibrate, drift_beyond_tolerance
    from accelbench.estimate.comm import load_bus_bandwidth
    from accelbench.estimate.engine_cost import with_dtensor_dispatch, with_fsdp_hooks, with_zero3_hooks
    from accelbench.estimate.peak import measured_peak
    from accelbench.plugins import get_host

    out = args.out or Path(tempfile.mkdtemp(prefix="estimate-vs-measured-"))
    backend = get_host().backends["cpu"]
    device = backend.setup_device(World(), {})
    threads = args.threads
    torch.set_num_threads(threads)
    peaks = {
        threads: measured_peak(backend, device, standard_plan("fp32", "ieee-fp32"), refresh=args.refresh_peak)
    }
    print(f"measured fp32 matmul peak, {threads} thread(s): {peaks[threads].flops_per_s / 1e9:.1f} GFLOP/s, "
          f"copy {peaks[threads].memory_bandwidth_bytes_per_s / 1e9:.1f} GB/s", flush=True)  # fmt: skip

    def calibrated(refresh: bool) -> Any:
        """This CPU's calibration at ``threads``, with the engine costs the strategies need (cached apart)."""
        name = backend.detect()[0].name
        calibration = calibrate(device, backend.synchronize, backend="cpu", device_name=name, dtype="float32",
                                refresh=refresh)  # fmt: skip
        print(f"calibration, {threads} thread(s): {calibration.describe()}", flush=True)
        if "deepspeed-zero3" in strategies:  # ZeRO-3's engine cost on this host, cached apart
            calibration = with_zero3_hooks(calibration, threads, refresh=args.refresh_calibration)
            hooks = calibration.zero3_hooks
            print(f"ZeRO-3 engine, {threads} thread(s): {hooks.describe() if hooks else calibration.notes[-1]}",
                  flush=True)  # fmt: skip
        if "fsdp" in strategies:  # FSDP2's hooks' cost on this host, cached apart
            kernels = backend.optimizer_implementation(device)
            calibration = with_fsdp_hooks(calibration, threads, kernels, refresh=args.refresh_calibration)
            fsdp = calibration.fsdp_hooks
            print(f"FSDP2 hooks, {threads} thread(s): {fsdp.describe() if fsdp else calibration.notes[-1]}",
                  flush=True)  # fmt: skip
        if "tp" in strategies:  # DTensor's dispatch cost on this host, cached apart
            calibration = with_dtensor_dispatch(calibration, threads, refresh=args.refresh_calibration)
            cost = calibration.dtensor_dispatch
            print(f"DTensor dispatch, {threads} thread(s): {cost.describe() if cost else calibration.notes[-1]}",
                  flush=True)  # fmt: skip
        return calibration

    calibration = calibrated(args.refresh_calibration)
    # each round's runs priced from the calibration in effect at its start: spot-checked there, as `accelbench run`
    # checks an hour-old one, and measured again where the device runs beyond the tolerance from it twice running
    # (this VM's speed moved 6% between a calibration and a round 40 minutes later)
    round_calibrations: list[Any] = []
    rounds: list[dict[str, Any]] = []
    earlier = previous["comm"] if previous else None
    comms = (
        [args.comm]
        if args.comm
        else [Path(c) for c in ([earlier] if isinstance(earlier, str) else earlier)]
        if earlier
        else [comm_record(out / "comm")]
    )
    if previous:
        runtimes = {k: int(v) for k, v in previous["runtime_bytes"].items()}
    else:
        runtimes = {s: runtime_bytes(args.threads, s) for s in ["single", *args.strategies]}
    print("runtime besides the model:", {k: f"{v / 2**20:.0f} MiB" for k, v in runtimes.items()}, flush=True)
    models = args.models + (["gpt2"] if args.gpt2 else [])
    configurations = (
        [(r["model"], r["strategy"], r["devices"]) for r in previous["rows"]]
        if previous
        else [(m, s, d) for m in models for s, d in [("single", 1), *((s, 2) for s in args.strategies)]]
    )
    paths: dict[tuple[str, str, int], list[Path]] = {c: [] for c in configurations}
    if previous:
        for r in previous["rows"]:
            paths[(r["model"], r["strategy"], r["devices"])] = [
                Path(p) for p in r.get("records", [r["record"]])
            ]
    else:
        for round_ in range(args.repeats):
            if round_ and not args.comm:  # a record between rounds, near each round's moment (all pooled)
                comms.append(comm_record(out / f"comm-{round_}"))
            drift = drift_beyond_tolerance(calibration, device, backend.synchronize)
            if drift is not None:
                print(f"round {round_ + 1}: the CPU runs {drift:+.0%} from its calibration: measured again",
                      flush=True)  # fmt: skip
                calibration = calibrated(True)
            round_calibrations.append(calibration)
            rounds.append({"drift": drift, "calibration_measured_at": calibration.measured_at})
            for model, strategy, devices in configurations:
                record = run(model, strategy, devices, args, out / "runs")
                suffix = f"-{round_ + 1}" if args.repeats > 1 else ""
                path = out / "runs" / f"{model}-{strategy}-{devices}{suffix}.json"
                path.write_text(json.dumps(record))
                paths[(model, strategy, devices)].append(path)
    if not args.comm and not previous:
        # a collective's time in a step moves by tens of percent within the hour on a shared host: a second
        # record after the runs, the two pooled (their in-step times averaged), prices them nearer their moment
        comms.append(comm_record(out / "comm-after"))
    bandwidth = load_bus_bandwidth(comms)
    if args.isolated_comm:
        bandwidth.in_step = []
    rows: list[dict[str, Any]] = []
    for (model, strategy, devices), found in paths.items():
        records = [json.loads(p.read_text()) for p in found]
        # each run priced from its round's calibration (--again: today's); the configuration's calibrated step the
        # median of its runs', the rest the same for each run
        each = [
            predicted(record, runtimes[strategy], bandwidth, peaks,
                      {threads: round_calibrations[i] if i < len(round_calibrations) else calibration})
            for i, record in enumerate(records)
        ]  # fmt: skip
        prediction = each[0] | {
            key: middle([p[key] for p in each]) for key in ("calibrated_step_s", "calibrated_samples_per_s")
        }
        prediction["calibrated_steps_s"] = [p["calibrated_step_s"] for p in each]
        row: dict[str, Any] = {
            "model": model, "strategy": strategy, "devices": devices, "record": str(found[0]),
            "records": [str(p) for p in found], "measured": median_of([measured(r) for r in records]),
            "predicted": prediction,
        }  # fmt: skip
        rows.append(row)
        m, p = row["measured"], row["predicted"]
        print(f"{model:10} {strategy:16} step {m['step_s'] * 1e3:8.1f} ms (pred {p['step_s'] * 1e3:8.1f}, "
              f"calibrated {p['calibrated_step_s'] * 1e3:8.1f}) "
              f"peak {m['peak_bytes'] / 2**20:7.1f} MiB (pred {p['peak_bytes'] / 2**20:7.1f}) "
              f"waiting {m['waiting'] or 0:.0%}", flush=True)  # fmt: skip
    single = {r["model"]: r for r in rows if r["strategy"] == "single"}
    for r in rows:
        base = single[r["model"]]
        r["measured"]["speedup"] = r["measured"]["samples_per_s"] / base["measured"]["samples_per_s"]
        ps, pb = r["predicted"]["samples_per_s"], base["predicted"]["samples_per_s"]
        r["predicted"]["speedup"] = ps / pb if ps and pb else None
        r["errors"] = {
            "step": error(r["predicted"]["step_s"], r["measured"]["step_s"]),
            "calibrated_step": error(r["predicted"]["calibrated_step_s"], r["measured"]["step_s"]),
            "calibrated_cpu_step": error(r["predicted"]["calibrated_step_s"], r["measured"]["cpu_step_s"]),
            "memory": error(r["predicted"]["peak_bytes"], r["measured"]["peak_bytes"]),
            "memory_model_part": error(
                r["predicted"]["peak_bytes"] - r["predicted"]["runtime_bytes"],
                r["measured"]["peak_bytes"] - r["predicted"]["runtime_bytes"],
            ),
            "tensors": error(
                r["predicted"]["peak_bytes"] - r["predicted"]["runtime_bytes"],
                r["measured"]["tensor_peak_bytes"],
            ),
            "speedup": error(r["predicted"]["speedup"], r["measured"]["speedup"])
            if r["devices"] > 1
            else None,
        }
    print()
    repeated = any(len(r["records"]) > 1 for r in rows)
    header = (f"{'model':10} {'strategy':16} {'step ms':>9} {'pred':>9} {'err':>6} {'calib':>9} {'err':>6} "
              f"{'cpu ms':>8} {'err':>6}  "
              f"{'peak MiB':>8} {'pred':>8} "
              f"{'err':>6} {'model-part err':>14}  {'tensors':>8} {'pred':>8} {'err':>6}  "
              f"{'speedup':>7} {'pred':>6} {'err':>6}  {'waited':>6}"
              + (f" {'spread':>6}" if repeated else ""))  # fmt: skip
    print(header)
    print("-" * len(header))

    def pct(x: float | None) -> str:
        return f"{x:+.0%}" if x is not None else "-"

    for r in rows:
        m, p, e = r["measured"], r["predicted"], r["errors"]
        speed = f"{m['speedup']:7.2f} {p['speedup']:6.2f}" if r["devices"] > 1 else f"{'':7} {'':6}"
        tensor = m.get("tensor_peak_bytes")
        tensors = (
            f"{tensor / 2**20:8.1f} {(p['peak_bytes'] - p['runtime_bytes']) / 2**20:8.1f}"
            if tensor
            else f"{'-':>8} {(p['peak_bytes'] - p['runtime_bytes']) / 2**20:8.1f}"
        )
        print(f"{r['model']:10} {r['strategy']:16} {m['step_s'] * 1e3:9.1f} {p['step_s'] * 1e3:9.1f} "
              f"{pct(e['step']):>6} {p['calibrated_step_s'] * 1e3:9.1f} {pct(e['calibrated_step']):>6} "
              f"{(m['cpu_step_s'] or 0) * 1e3:8.1f} {pct(e['calibrated_cpu_step']):>6}  "
              f"{m['peak_bytes'] / 2**20:8.1f} {p['peak_bytes'] / 2**20:8.1f} "
              f"{pct(e['memory']):>6} {pct(e['memory_model_part']):>14}  {tensors} {pct(e['tensors']):>6}  "
              f"{speed} {pct(e['speedup']):>6}  "
              f"{m['waiting'] or 0:6.0%}"
              + (f" {m['step_spread']:6.0%}" if m["step_spread"] is not None else ""))  # fmt: skip
    print(f"\nrecords: {out / 'runs'}; this host is shared: 'waited' is the share of ready time the run's threads "
          "waited for a core")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "runtime_bytes": runtimes, "comm": [str(c) for c in comms],
                                         "peaks": {k: v.model_dump() for k, v in peaks.items()},
                                         "calibrations": {threads: calibration.model_dump()},
                                         "rounds": rounds},
                                        indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
