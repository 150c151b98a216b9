"""The `accelbench comm` command line: its options, message sizes as people write them, and the checked request.

No torch here: ``accelbench comm --help`` and a refused request cost no torch import.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from accelbench.comm.collectives import COLLECTIVES, DTYPE_ALIASES, DTYPE_BYTES, DTYPES, OPS, size_label
from accelbench.comm.records import CommConfig, CommRecord
from accelbench.config import RunConfig, flag_of
from accelbench.errors import ConfigError

DEFAULT_MIN_BYTES = 8
DEFAULT_MAX_BYTES = 128 * 2**20
MAX_SIZES = 200  # a longer list is a mistake (a factor of 1.001), not a benchmark
# No message is larger than 1 PiB: no device or host holds one (the memory check refuses far smaller ones on any
# machine); the bound only keeps the arithmetic of absurd sizes (99999999999999T) finite.
MAX_MESSAGE_BYTES = 2**50
# Iterations per size: nccl-tests times 20 by default. 10^5 timed iterations of even the smallest message (tens of
# microseconds each) take seconds per size, and every timed iteration's time is kept (a float per iteration, on the
# device and in Python): more is a typo, and 10^12 would never finish and fill memory.
MAX_ITERS = 100_000
MAX_BURST = 1024  # --burst: calls issued back to back, at most
MAX_IN_STEP_MS = 10_000.0  # --in-step: a step's compute between two of its collectives, at most (10 s)
MAX_IN_STEP_LENGTHS = 8
HOST_MEMORY_SHARE = 0.8  # of the host's available memory the ranks on it may take for buffers (CPU devices)
# Elements filled or checked at a time (accelbench.comm.run): the index arithmetic's scratch stays bounded.
CHUNK = 1 << 24
EXIT_CODES_HELP = (
    "exit status: 0 ok (sizes that did not fit in memory are recorded as such); 1 a wrong result or a failed rank "
    "(record written); 2 refused before measuring (nothing written); 130 interrupted (record written with the "
    "sizes measured)"
)

# suffix -> bytes; K, M, G are binary as in nccl-tests (-b 8 -e 128M); KB, MB, GB are decimal
_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kib": 2**10, "kb": 10**3,
    "m": 2**20, "mib": 2**20, "mb": 10**6,
    "g": 2**30, "gib": 2**30, "gb": 10**9,
    "t": 2**40, "tib": 2**40, "tb": 10**12,
}  # fmt: skip


def parse_size(text: str, flag: str = "--sizes") -> int:
    """Bytes from ``8``, ``1KiB``, ``64MiB``, ``1.5G`` (K/M/G and KiB/MiB/GiB: powers of 1024; KB/MB/GB: of 1000)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = _UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        raise ConfigError(
            f"{flag} {text!r}: not a size; write bytes as 8, 1KiB, 64MiB or 1GiB (K, M, G are powers of 1024)"
        )
    value = float(match.group(1)) * unit
    if not value <= MAX_MESSAGE_BYTES:  # also a number too long to be a float (inf)
        raise ConfigError(
            f"{flag} {text!r}: larger than any message a device or host can hold (at most {size_label(MAX_MESSAGE_BYTES)}"
            " here, and memory refuses far less); give a size such as 64MiB or 1GiB"
        )
    if value != int(value) or value < 1:
        raise ConfigError(f"{flag} {text!r}: a message is a whole number of bytes, at least 1")
    return int(value)


def size_series(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """``min_bytes``, x factor, ... up to ``max_bytes`` (as nccl-tests' -b/-e/-f: the last size is the largest not
    above the maximum)."""
    if min_bytes > max_bytes:
        raise ConfigError(
            f"--min-bytes {size_label(min_bytes)} is larger than --max-bytes {size_label(max_bytes)}; "
            "swap them, or give one size with --sizes"
        )
    if not 1 < factor < math.inf:
        raise ConfigError(
            f"--factor {factor:g}: sizes grow by it, so it must be a number above 1 (2 doubles them)"
        )
    sizes: list[int] = []
    step = 0
    while (size := min_bytes * factor**step) <= max_bytes:
        sizes.append(int(size))
        if len(sizes) > MAX_SIZES:
            raise ConfigError(
                f"--factor {factor:.12g} from {size_label(min_bytes)} to {size_label(max_bytes)} makes more than "
                f"{MAX_SIZES} sizes; use a larger factor (2 doubles), or list the sizes with --sizes"
            )
        # the next step whose size is a whole byte larger (a factor near 1 repeats a size many times: skip those at
        # once, rather than step through millions of them)
        step = max(step + 1, math.ceil(math.log((sizes[-1] + 1) / min_bytes) / math.log(factor) - 1e-9))
    return sizes


def buffer_bytes(op: str, variant: str, dtype: str, count: int, ranks: int) -> int:
    """One rank's bytes for a case of ``count`` elements: the collective's send and receive buffers (as
    :class:`accelbench.comm.run.Case` allocates them: in place, one buffer; out of place, the input and the output,
    a sharded one's part 1/ranks of the array), and the scratch of filling and checking them (int64 positions,
    float32 values and differences: 24 bytes an element, at most :data:`CHUNK` elements at a time)."""
    collective = COLLECTIVES[op]
    part = count // ranks if collective.sharded else count
    elements = {
        "all_reduce": count, "broadcast": count, "reduce": count, "all_to_all": 2 * count, "sendrecv": 2 * count,
        "all_gather": count + (0 if variant == "in-place" else part),
        "reduce_scatter": count + (0 if variant == "in-place" else part),
    }[op]  # fmt: skip
    return elements * DTYPE_BYTES[dtype] + 24 * min(CHUNK, count)


def largest_case(config: CommConfig, size: int, ranks: int) -> tuple[int, str]:
    """The most bytes one rank needs for a message of ``size`` bytes over the request's collectives, types and
    variants, and which case needs them (e.g. ``all_to_all fp32 out-of-place``)."""
    most, which = 0, ""
    for op in config.ops:
        collective = COLLECTIVES[op]
        for dtype in config.dtypes:
            count = collective.count(size, dtype, ranks)
            for variant in collective.variants:
                needed = buffer_bytes(op, variant, dtype, count, ranks)
                if needed > most:
                    most, which = needed, f"{op} {dtype} {variant}"
    return most, which


def largest_size_that_fits(config: CommConfig, ranks: int, room: int, below: int) -> int:
    """The largest message size under ``below`` bytes whose every case of the request fits in ``room`` bytes per
    rank (0 if not even one byte does): a binary search, the bytes needed growing with the size."""
    low, high = 0, below  # low fits (or is 0), high does not
    while high - low > 1:
        middle = (low + high) // 2
        if largest_case(config, middle, ranks)[0] <= room:
            low = middle
        else:
            high = middle
    return low


def check_sizes_fit(config: CommConfig, ranks: int, room: int, where: str, flag: str) -> None:
    """Refuse, before anything starts, a message size whose buffers cannot fit in ``room`` bytes per rank (``where``
    says whose memory that is), naming the largest size that fits. Sizes that fit here may still run out of memory
    while measuring (others' use, fragmentation): those are recorded as such."""
    largest = config.sizes[-1]
    needed, which = largest_case(config, largest, ranks)
    if needed <= room:
        return
    low = largest_size_that_fits(config, ranks, room, largest)
    if low < config.sizes[0]:
        fits = f"not even the smallest size asked for ({size_label(config.sizes[0])}) fits"
        if low >= 1:
            fits += f"; at most {size_label(low)} does"
    else:
        power = 1 << (low.bit_length() - 1)  # a round size to give
        fits = (
            f"the largest message that fits is {size_label(low)}: give {flag} "
            f"{size_label(power).replace(' ', '')} (or less)"
        )
    raise ConfigError(
        f"{flag}: a {size_label(largest)} message needs {size_label(needed)} per rank ({which}: its buffers and the "
        f"scratch of filling and checking them), and {where} has {size_label(room)} for each; {fits}"
    )


def _names(text: str, known: tuple[str, ...], flag: str, aliases: dict[str, str] | None = None) -> list[str]:
    """A comma-separated list of names (``all`` for every one), each checked; hyphens read as underscores."""
    given = [t.strip().lower() for t in text.split(",") if t.strip()]
    if given == ["all"]:
        return list(known)
    out: list[str] = []
    for name in given:
        name = (aliases or {}).get(name, name.replace("-", "_"))
        if name not in known:
            raise ConfigError(
                f"{flag}: unknown {flag.strip('-').rstrip('s')} {name!r}; choose from: {', '.join(known)}"
            )
        if name not in out:
            out.append(name)
    if not out:
        raise ConfigError(f"{flag}: give at least one of: {', '.join(known)} (or all)")
    return out


def add_comm_arguments(parser: argparse.ArgumentParser) -> None:
    """The `comm` subcommand's options."""
    parser.epilog = EXIT_CODES_HELP
    what = parser.add_argument_group("what is measured")
    what.add_argument(
        "--backend", help="backend name (default: the highest-priority backend that detects a device)"
    )
    what.add_argument(
        "--ops",
        default="all",
        metavar="LIST",
        help=f"collectives, comma-separated, or all (default: all): {', '.join(OPS)}",
    )
    what.add_argument(
        "--dtypes",
        default="fp32",
        metavar="LIST",
        help=f"element types, comma-separated (default: fp32): {', '.join(DTYPES)}",
    )
    what.add_argument(
        "--min-bytes",
        default=str(DEFAULT_MIN_BYTES),
        metavar="SIZE",
        help=f"smallest message, e.g. 8, 1KiB, 64MiB (default: {size_label(DEFAULT_MIN_BYTES)})",
    )
    what.add_argument(
        "--max-bytes",
        default=size_label(DEFAULT_MAX_BYTES).replace(" ", ""),
        metavar="SIZE",
        help=f"largest message (default: {size_label(DEFAULT_MAX_BYTES)})",
    )
    what.add_argument("--factor", type=float, default=2.0, help="each size is the last x this (default: 2)")
    what.add_argument(
        "--sizes", metavar="LIST", help="these sizes instead of --min-bytes..--max-bytes, e.g. 1KiB,1MiB,1GiB"
    )
    what.add_argument(
        "--warmup", type=int, default=5, metavar="N", help="untimed iterations per size (default: 5)"
    )
    what.add_argument(
        "--iters", type=int, default=20, metavar="N", help="timed iterations per size (default: 20)"
    )
    what.add_argument(
        "--in-step",
        metavar="MS",
        help="also time each collective as a training step meets it: after about MS milliseconds of matrix "
        "products on every rank (comma-separated for several, e.g. 5,20,80), waiting for the slower rank included; "
        "what `accelbench estimate` prices a step's collectives at when the record has it",
    )
    what.add_argument(
        "--burst",
        type=int,
        default=0,
        metavar="N",
        help="also time each collective as N calls issued back to back without waiting, then waited for (a "
        "call's share of it), as DeepSpeed ZeRO-3 gathers its persistent tensors after a step; what `accelbench "
        f"estimate` prices such a burst at (2 to {MAX_BURST}; default: not measured)",
    )
    what.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="do not check results against the expected values (#wrong shows N/A)",
    )
    job = parser.add_argument_group("the job (as for accelbench run)")
    for name in ("devices", "nnodes", "node_rank", "rdzv_endpoint", "collective_timeout", "threads"):
        info = RunConfig.model_fields[name]
        kind = float if name == "collective_timeout" else str if name == "rdzv_endpoint" else int
        job.add_argument(
            "--" + flag_of(name),
            dest=name,
            type=kind,
            default=argparse.SUPPRESS,
            metavar=flag_of(name).upper().replace("-", "_"),
            help=f"{info.description} (default: {info.default})".replace("%", "%%"),
        )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--output-dir", type=Path, default=Path("results"), help="where the record goes (default: results)"
    )
    out.add_argument("--quiet", "-q", action="store_true", help="no table")
    out.add_argument(
        "--json", action="store_true", help="print the record as JSON on stdout (the table goes to stderr)"
    )


def launch_config(args: argparse.Namespace, backend: str | None) -> RunConfig:
    """The job's shape checked exactly as `accelbench run` checks it (devices, nodes, rendezvous, timeout)."""
    values: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("devices", "nnodes", "node_rank", "rdzv_endpoint", "collective_timeout", "threads")
        if hasattr(args, name)
    }
    try:
        return RunConfig(backend=backend, output_dir=args.output_dir, **values)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            loc = str(e["loc"][0]) if e["loc"] else ""
            problems.append(
                (f"--{flag_of(loc)}: " if loc else "") + str(e["msg"]).removeprefix("Value error, ")
            )
        raise ConfigError("; ".join(problems)) from None


def comm_config(args: argparse.Namespace) -> tuple[CommConfig, RunConfig]:
    """The request, checked: names known, sizes readable and in order, counts positive; and the job's shape (node
    rank, rendezvous) as `run` checks it. A ConfigError names the flag and what to give instead."""
    ops = _names(args.ops, OPS, "--ops")
    dtypes = _names(args.dtypes, DTYPES, "--dtypes", DTYPE_ALIASES)
    if args.sizes is not None:
        sizes = sorted({parse_size(t) for t in args.sizes.split(",") if t.strip()})
        if not sizes:
            raise ConfigError("--sizes: give at least one size, e.g. --sizes 1KiB,1MiB")
    else:
        sizes = size_series(
            parse_size(args.min_bytes, "--min-bytes"), parse_size(args.max_bytes, "--max-bytes"), args.factor
        )
    if not 1 <= args.iters <= MAX_ITERS:
        raise ConfigError(
            f"--iters {args.iters}: at least 1 timed iteration per size, and at most {MAX_ITERS} (nccl-tests "
            "times 20)"
        )
    if not 0 <= args.warmup <= MAX_ITERS:
        raise ConfigError(
            f"--warmup {args.warmup}: 0 or more untimed iterations per size, and at most {MAX_ITERS}"
        )
    in_step = parse_in_step(args.in_step) if getattr(args, "in_step", None) is not None else []
    burst = getattr(args, "burst", 0)
    if burst and not 2 <= burst <= MAX_BURST:
        raise ConfigError(
            f"--burst {burst}: a burst is 2 to {MAX_BURST} calls issued back to back (ZeRO-3 issues one a "
            "persistent tensor, e.g. --burst 16); leave it out to time calls alone only"
        )
    launch = launch_config(args, args.backend)
    config = CommConfig(
        backend=args.backend,
        ops=ops,  # type: ignore[arg-type]  # checked against OPS above
        dtypes=dtypes,  # type: ignore[arg-type]
        sizes=sizes,
        warmup=args.warmup,
        iters=args.iters,
        check=args.check,
        devices=launch.devices,
        nnodes=launch.nnodes,
        collective_timeout=launch.collective_timeout,
        threads=launch.threads,
        in_step_ms=in_step,
        burst=burst,
        output_dir=args.output_dir,
    )
    return config, launch


def parse_in_step(text: str) -> list[float]:
    """``--in-step``'s compute lengths in milliseconds: positive, finite, at most :data:`MAX_IN_STEP_MS`, at most
    :data:`MAX_IN_STEP_LENGTHS` of them, ascending and distinct."""
    lengths: set[float] = set()
    for part in (t.strip() for t in text.split(",")):
        try:
            value = float(part)
        except ValueError:
            raise ConfigError(
                f"--in-step {text}: {part!r} is not a number of milliseconds; give e.g. --in-step 5,20,80"
            ) from None
        if not (math.isfinite(value) and 0 < value <= MAX_IN_STEP_MS):
            raise ConfigError(
                f"--in-step {text}: {part} ms is not a step's compute between two collectives (more than 0, at "
                f"most {MAX_IN_STEP_MS:g} ms)"
            )
        lengths.add(value)
    if len(lengths) > MAX_IN_STEP_LENGTHS:
        raise ConfigError(f"--in-step {text}: at most {MAX_IN_STEP_LENGTHS} compute lengths")
    return sorted(lengths)


def implausible(record: CommRecord) -> str | None:
    """Why a comm record's figures cannot have been measured (made or edited by hand): a size beyond any memory or
    below a byte, a time or bandwidth that is negative, infinite or NaN, fewer than 2 ranks; None when they can."""
    if record.world_size < 2:
        return f"world_size {record.world_size}: a collective is measured over 2 or more ranks"
    for i, m in enumerate(record.measurements):
        if not 1 <= m.size_bytes <= MAX_MESSAGE_BYTES or m.count < 0:
            return f"measurements.{i}: size_bytes {m.size_bytes} is not a message size (1 B to 1 PiB)"
        for name in (
            "time_us",
            "time_us_min",
            "time_us_max",
            "algbw_gbps",
            "busbw_gbps",
            "bus_factor",
            "burst_us",
        ):
            value = getattr(m, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                return f"measurements.{i}.{name}: {value} is not a measured figure (finite, 0 or more)"
        for j, timed in enumerate(m.in_step):
            if not (math.isfinite(timed.time_us) and math.isfinite(timed.compute_ms)):
                return f"measurements.{i}.in_step.{j}: {timed.time_us} us after {timed.compute_ms} ms is not measured"
    return None


def describe(config: CommConfig) -> str:
    """The request in one line, for the table's heading."""
    sizes = config.sizes
    span = size_label(sizes[0]) if len(sizes) == 1 else f"{size_label(sizes[0])}..{size_label(sizes[-1])}"
    factors = "; ".join(f"{op}: {COLLECTIVES[op].formula}" for op in config.ops)
    in_step = (
        f"; each also timed after about {', '.join(f'{ms:g}' for ms in config.in_step_ms)} ms of compute (in step)"
        if config.in_step_ms
        else ""
    )
    burst = f"; each also timed in bursts of {config.burst} calls back to back" if config.burst else ""
    return (
        f"{len(sizes)} size(s) {span}, {', '.join(config.dtypes)}, {config.warmup} warm-up + {config.iters} timed "
        f"iterations, results {'checked' if config.check else 'not checked'}; busbw = algbw x ({factors})"
        f"{in_step}{burst}"
    )
