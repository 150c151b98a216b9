"""Measuring collectives on one rank: buffers filled with known values, timed calls, the result checked.

Every rank runs :func:`measure` with the same request and takes the same decisions, because every decision that
depends on one rank (did its buffers fit, did the backend accept the call) is agreed with a small all_reduce
before anyone acts on it. What a rank cannot agree on (it died, a collective failed half-way) ends the job with
an error; the measurements completed before it are kept, as they are on SIGTERM or Ctrl-C.

The values (see :class:`Case`) are small integers, so sums are exact in every type (bf16 up to 128 ranks, fp16
up to 1024): a result is checked element by element against the expected values, with a tolerance only beyond
those rank counts, and an element that differs is counted (#wrong), as nccl-tests ``-c`` does.
"""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from accelbench.comm.collectives import COLLECTIVES, DTYPE_BYTES, Collective, Variant, size_label
from accelbench.comm.options import CHUNK, HOST_MEMORY_SHARE, buffer_bytes
from accelbench.comm.records import CommConfig, CommMeasurement, InStepTime, MeasurementStatus, summarise
from accelbench.engine.runner import is_out_of_memory
from accelbench.engine.signals import TERMINATION, RunInterrupted
from accelbench.results import Outcome

if TYPE_CHECKING:
    from accelbench.contract import Backend
    from accelbench.launch import LaunchEnv

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# agreed codes, most serious last: the all_reduce MAX of the ranks' codes is what all of them act on
_OK, _OOM, _UNSUPPORTED, _ERROR = 0, 1, 2, 3
COMPUTE_SIDE = 256  # --in-step's products: 256^3 multiply-adds each (about 0.2 ms on one CPU core, microseconds on a GPU)
COMPUTE_PROBE = 20  # products timed to size the compute
_STATUS: dict[int, MeasurementStatus] = {_OOM: "oom", _UNSUPPORTED: "unsupported", _ERROR: "error"}

Values = Callable[[torch.Tensor], torch.Tensor]  # element positions (int64) -> their values (float32)


def reduced_value(rank: int) -> Values:
    """Rank ``rank``'s values for reducing collectives: -2..2, so that any partial sum stays small (exact)."""
    return lambda k: ((k + 3 * rank) % 5 - 2).to(torch.float32)


def summed_value(ranks: int, offset: int = 0) -> Values:
    """The sum over ``ranks`` ranks of :func:`reduced_value` at positions ``k + offset``: each 5 consecutive ranks
    add up to 0 (their values run through -2..2), so only the last ``ranks % 5`` ranks count."""
    return lambda k: sum(
        (((k + offset + 3 * t) % 5 - 2).to(torch.float32) for t in range(ranks % 5)),
        torch.zeros_like(k, dtype=torch.float32),
    )


def copied_value(rank: int, offset: int = 0) -> Values:
    """Rank ``rank``'s values for collectives that move data without reducing it: 0..240, different per rank."""
    return lambda k: ((k + offset + 7 * rank) % 241).to(torch.float32)


def tolerance(dtype: torch.dtype, ranks: int, reduces: bool) -> float:
    """How far a checked element may be from its expected value: 0 while every partial sum (at most 2 x ranks)
    is an integer the type holds exactly; beyond, the rounding of ``ranks`` additions at that magnitude."""
    if not reduces:
        return 0.0
    info = torch.finfo(dtype)
    exact_up_to = 2 / info.eps  # 2^(mantissa bits + 1): every integer up to it is held exactly
    return 0.0 if 2 * ranks <= exact_up_to else 2.0 * ranks * ranks * info.eps


class Case:
    """One collective x type x variant x count on this rank: its buffers, how they are filled, the call, and
    what the result must be. Built by allocating the buffers (which may run out of memory)."""

    def __init__(
        self,
        collective: Collective,
        variant: Variant,
        dtype: torch.dtype,
        count: int,
        rank: int,
        ranks: int,
        device: torch.device,
    ) -> None:
        self.collective, self.variant, self.dtype = collective, variant, dtype
        self.rank, self.ranks, self.count = rank, ranks, count
        self.tol = tolerance(dtype, ranks, collective.reduces)
        r, n = rank, ranks
        c = count // n if collective.sharded else count  # one rank's part of a sharded array
        in_place = variant == "in-place"

        def empty(elements: int) -> torch.Tensor:
            return torch.empty(elements, dtype=dtype, device=device)

        name = collective.name
        self.fills: list[tuple[torch.Tensor, Values]]
        self.checked: tuple[torch.Tensor, Values] | None
        if name == "all_reduce":
            buf = empty(count)
            self.fills, self.checked = [(buf, reduced_value(r))], (buf, summed_value(n))
            self._call: Callable[[], object] = lambda: dist.all_reduce(buf)
            self._start: Callable[[], Any] = lambda: dist.all_reduce(buf, async_op=True)
        elif name == "all_gather":
            out = empty(count)
            inp = out.narrow(0, r * c, c) if in_place else empty(c)
            self.fills = [(inp, copied_value(r))]
            self.checked = (out, lambda k: ((k % c + 7 * (k // c)) % 241).to(torch.float32))
            gather = (
                getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            )  # renamed in 2.13
            self._call = lambda: gather(out, inp)
            self._start = lambda: gather(out, inp, async_op=True)
        elif name == "reduce_scatter":
            inp = empty(count)
            out = inp.narrow(0, r * c, c) if in_place else empty(c)
            self.fills, self.checked = [(inp, reduced_value(r))], (out, summed_value(n, offset=r * c))
            scatter = (
                getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            )  # renamed in 2.13
            self._call = lambda: scatter(out, inp)
            self._start = lambda: scatter(out, inp, async_op=True)
        elif name == "broadcast":
            buf = empty(count)
            self.fills, self.checked = [(buf, copied_value(r))], (buf, copied_value(0))
            self._call = lambda: dist.broadcast(buf, src=0)
            self._start = lambda: dist.broadcast(buf, src=0, async_op=True)
        elif name == "reduce":
            buf = empty(count)
            self.fills = [(buf, reduced_value(r))]
            self.checked = (buf, summed_value(n)) if r == 0 else None  # other ranks' buffers are scratch
            self._call = lambda: dist.reduce(buf, dst=0)
            self._start = lambda: dist.reduce(buf, dst=0, async_op=True)
        elif name == "all_to_all":
            inp, out = empty(count), empty(count)
            self.fills = [(inp, copied_value(r))]
            # part s of the output is rank s's part r: its values at positions r*c + j of rank s's input
            self.checked = (out, lambda k: ((r * c + k % c + 7 * (k // c)) % 241).to(torch.float32))
            self._call = lambda: dist.all_to_all_single(out, inp)
            self._start = lambda: dist.all_to_all_single(out, inp, async_op=True)
        elif name == "sendrecv":
            send, recv = empty(count), empty(count)
            self.fills, self.checked = [(send, copied_value(r))], (recv, copied_value((r - 1) % n))
            ops: list[dist.P2POp] = []  # made at the first call: a P2POp needs the process group

            def started() -> list[Any]:
                if not ops:
                    ops.extend(
                        [dist.P2POp(dist.isend, send, (r + 1) % n), dist.P2POp(dist.irecv, recv, (r - 1) % n)]
                    )
                return list(dist.batch_isend_irecv(ops))

            def sendrecv() -> None:
                for work in started():
                    work.wait()

            self._call, self._start = sendrecv, started
        else:  # pragma: no cover - COLLECTIVES names every case above
            raise AssertionError(name)

    @staticmethod
    def bytes_needed(collective: Collective, variant: Variant, dtype: str, count: int, ranks: int) -> int:
        """This rank's buffer bytes for a case, and the scratch of filling and checking, before allocating (the
        same count as the up-front check's, :func:`accelbench.comm.options.buffer_bytes`)."""
        return buffer_bytes(collective.name, variant, dtype, count, ranks)

    def run(self) -> None:
        """One call of the collective (its work queued on the device; the caller synchronises)."""
        self._call()

    def run_burst(self, calls: int) -> None:
        """``calls`` calls issued back to back without waiting (``async_op``), then each waited for: a burst, as
        ZeRO-3 gathers its persistent tensors one call each (the caller synchronises)."""
        started = [self._start() for _ in range(calls)]
        for work in started:
            for each in work if isinstance(work, list) else [work]:
                each.wait()

    def fill(self) -> None:
        """Write the known values into the input buffers."""
        for tensor, values in self.fills:
            for start in range(0, tensor.numel(), CHUNK):
                stop = min(tensor.numel(), start + CHUNK)
                index = torch.arange(start, stop, device=tensor.device, dtype=torch.int64)
                tensor[start:stop] = values(index).to(tensor.dtype)

    def wrong(self) -> int:
        """Elements of this rank's result that differ from the expected values by more than the tolerance."""
        if self.checked is None:
            return 0
        return count_wrong(self.checked[0], self.checked[1], self.tol)


def count_wrong(result: torch.Tensor, expected: Values, tol: float = 0.0) -> int:
    """Elements of ``result`` further than ``tol`` from ``expected`` (a NaN is always wrong)."""
    wrong = 0
    for start in range(0, result.numel(), CHUNK):
        stop = min(result.numel(), start + CHUNK)
        index = torch.arange(start, stop, device=result.device, dtype=torch.int64)
        difference = (result[start:stop].to(torch.float32) - expected(index)).abs()
        wrong += int((~(difference <= tol)).sum().item())
    return wrong


@dataclass
class Job:
    """What measuring needs on this rank: the request, the backend and device, the rank's place."""

    config: CommConfig
    backend: Backend
    device: torch.device
    launch: LaunchEnv


class Measuring:
    """One rank's pass over the request; the state its decisions need (what gave up, what was measured)."""

    def __init__(self, job: Job, on_row: Callable[[Sequence[CommMeasurement]], None]) -> None:
        self.job = job
        self.on_row = on_row
        self.rank, self.ranks = job.launch.rank, job.launch.world_size
        self.device = job.device
        self.measurements: list[CommMeasurement] = []
        self._flag = torch.zeros(1, dtype=torch.int64, device=job.device)
        self._compute: Compute | None = None  # --in-step's products, made at first use

    # agreement -----------------------------------------------------------------------------------------------
    def agree(self, code: int) -> int:
        """The most serious code any rank has: what every rank acts on."""
        self._flag.fill_(code)
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)
        return int(self._flag.item())

    def align(self) -> None:
        """A one-element all_reduce: no rank starts the timed call before every rank has arrived."""
        dist.all_reduce(self._flag)

    def synchronize(self) -> None:
        self.job.backend.synchronize(self.device)

    # the pass --------------------------------------------------------------------------------------------------
    def run(self) -> None:
        config = self.job.config
        for op in config.ops:
            collective = COLLECTIVES[op]
            for dtype in config.dtypes:
                gave_up: dict[str, tuple[MeasurementStatus, str]] = {}
                counts: set[int] = set()
                for requested in config.sizes:
                    count = collective.count(requested, dtype, self.ranks)
                    if count in counts:  # two sizes asked for round to the same array
                        continue
                    counts.add(count)
                    row = [self.measure(collective, variant, dtype, count, requested, gave_up)
                           for variant in collective.variants]  # fmt: skip
                    self.measurements += row
                    self.on_row(row)
                self.job.backend.release_memory(self.device)

    def measure(
        self,
        collective: Collective,
        variant: Variant,
        dtype: str,
        count: int,
        requested: int,
        gave_up: dict[str, tuple[MeasurementStatus, str]],
    ) -> CommMeasurement:
        """One case: allocate and fill (agreed), a first untimed call (agreed: the backend may refuse the
        collective or type), warm-up, the timed iterations, and the check of a fresh call's result."""
        config = self.job.config
        size = count * DTYPE_BYTES[dtype]
        base = {"op": collective.name, "dtype": dtype, "variant": variant, "size_bytes": size, "count": count,
                "requested_bytes": requested, "bus_factor": collective.bus_factor(self.ranks)}  # fmt: skip
        if variant in gave_up:
            status, why = gave_up[variant]
            return CommMeasurement(**base, status=status, message=f"not attempted: {why}")  # type: ignore[arg-type]
        code, message, case = _OK, "", None
        try:
            needed = Case.bytes_needed(collective, variant, dtype, count, self.ranks)
            room = self.host_room()
            if room is not None and needed > room:
                code, message = _OOM, f"needs {size_label(needed)} per rank; {size_label(room)} free for each"
            else:
                case = Case(
                    collective, variant, TORCH_DTYPES[dtype], count, self.rank, self.ranks, self.device
                )
                case.fill()
                self.synchronize()
        except Exception as exc:  # noqa: BLE001 - agreed below, then recorded
            code, message, case = (_OOM if is_out_of_memory(exc) else _ERROR), _short(exc), None
        if self.agree(code) == _OK:
            assert case is not None
            try:  # the first call: a collective or type the backend lacks is refused here, on every rank alike
                case.run()
                self.synchronize()
            except Exception as exc:  # noqa: BLE001 - agreed below, then recorded
                code, message = (_OOM if is_out_of_memory(exc) else _UNSUPPORTED), _short(exc)
        agreed = self.agree(code)
        if agreed != _OK:
            del case
            self.job.backend.release_memory(self.device)
            status = _STATUS[agreed]
            message = message or "on another rank"
            if status in ("oom", "unsupported"):
                gave_up[variant] = (
                    status,
                    f"{size_label(size)} was {'out of memory' if status == 'oom' else 'refused'}",
                )
            return CommMeasurement(**base, status=status, message=message)  # type: ignore[arg-type]
        assert case is not None
        for _ in range(config.warmup - 1):
            case.run()
        self.synchronize()
        times = []
        for _ in range(config.iters):
            self.align()
            self.synchronize()
            start = time.perf_counter()
            case.run()
            self.synchronize()
            times.append((time.perf_counter() - start) * 1e6)
        slowest = torch.tensor(times, dtype=torch.float64, device=self.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # each iteration's time is its slowest rank's
        per_iteration = slowest.tolist()
        wrong = None
        if config.check:
            case.fill()
            case.run()
            self.synchronize()
            counted = torch.tensor([case.wrong()], dtype=torch.int64, device=self.device)
            dist.all_reduce(counted)
            wrong = int(counted.item())
        median = statistics.median(per_iteration)
        strategies_variant = variant == collective.variants[0]  # out-of-place where both are offered
        in_step = [self.in_step(case, ms, median) for ms in config.in_step_ms] if strategies_variant else []
        burst = self.burst(case, config.burst) if strategies_variant and config.burst else None
        figures = {"iters": config.iters, "time_us": median, "time_us_min": min(per_iteration),
                   "time_us_max": max(per_iteration), "wrong": wrong, "in_step": in_step,
                   "burst_us": burst}  # fmt: skip
        if wrong:  # a wrong result is a failure, not a bandwidth
            return CommMeasurement(**base, **figures, status="wrong",  # type: ignore[arg-type]
                                   message=f"{wrong} element(s) differ from the expected result")  # fmt: skip
        algbw = size / (median * 1e-6) / 1e9 if median > 0 else None
        busbw = algbw * collective.bus_factor(self.ranks) if algbw is not None else None
        return CommMeasurement(**base, **figures, status="ok", algbw_gbps=algbw, busbw_gbps=busbw)  # type: ignore[arg-type]

    def in_step(self, case: Case, compute_ms: float, alone_us: float) -> InStepTime:
        """The call as a training step meets it (``--in-step``): after about ``compute_ms`` of matrix products
        on every rank, aligned before the products as a step's ranks leave its previous collective together. Each
        rank's time of the call holds its wait for the slower rank; the mean over ranks and iterations is what a
        step's time gains from the call."""
        if self._compute is None:
            self._compute = Compute.measured(self.device, self.synchronize, self.agree_seconds)
        products = self._compute.products(compute_ms)
        self._compute.run(products)  # warm-up
        case.run()
        self.synchronize()
        computed = called = 0.0
        iters = self.job.config.iters
        for _ in range(iters):
            self.align()
            self.synchronize()
            start = time.perf_counter()
            self._compute.run(products)
            self.synchronize()
            middle = time.perf_counter()
            case.run()
            self.synchronize()
            called += time.perf_counter() - middle
            computed += middle - start
        sums = torch.tensor([computed, called], dtype=torch.float64, device=self.device)
        dist.all_reduce(sums)
        computed, called = (float(v) / (iters * self.ranks) for v in sums.tolist())
        return InStepTime(compute_ms=computed * 1e3, time_us=called * 1e6, alone_us=alone_us)

    def burst(self, case: Case, calls: int) -> float:
        """A call's time within a burst of ``calls`` (``--burst``): each iteration's burst, aligned, timed on
        every rank, its slowest rank's time; the median over iterations, over ``calls``."""
        case.run_burst(calls)  # warm-up: a burst queues more work at once than single calls do
        self.synchronize()
        times = []
        for _ in range(self.job.config.iters):
            self.align()
            self.synchronize()
            start = time.perf_counter()
            case.run_burst(calls)
            self.synchronize()
            times.append((time.perf_counter() - start) * 1e6 / calls)
        slowest = torch.tensor(times, dtype=torch.float64, device=self.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return float(statistics.median(slowest.tolist()))

    def agree_seconds(self, seconds: float) -> float:
        """The largest of the ranks' ``seconds``: what every rank sizes its compute by."""
        value = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value.item())

    def host_room(self) -> int | None:
        """Bytes each rank on this host may take on a CPU device (None elsewhere: the allocator says when it is
        full). On the host, buffers beyond the available memory are not refused but swapped or killed, so a size
        that cannot fit is not tried."""
        if self.device.type != "cpu":
            return None
        import psutil

        available = psutil.virtual_memory().available
        return int(available * HOST_MEMORY_SHARE / max(1, self.job.launch.local_world_size))


class Compute:
    """``--in-step``'s compute: square fp32 products of :data:`COMPUTE_SIDE`, queued back to back; the same count on
    every rank, sized by the slowest rank's time for one product."""

    def __init__(
        self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, seconds_per_product: float
    ) -> None:
        self.a, self.b, self.out = a, b, out
        self.seconds_per_product = seconds_per_product

    @classmethod
    def measured(
        cls, device: torch.device, synchronize: Callable[[], None], agree: Callable[[float], float]
    ) -> Compute:
        a = torch.randn(COMPUTE_SIDE, COMPUTE_SIDE, device=device)
        b, out = torch.randn_like(a), torch.empty_like(a)
        compute = cls(a, b, out, 0.0)
        compute.run(COMPUTE_PROBE)  # warm-up
        synchronize()
        start = time.perf_counter()
        compute.run(COMPUTE_PROBE)
        synchronize()
        compute.seconds_per_product = agree((time.perf_counter() - start) / COMPUTE_PROBE)
        return compute

    def products(self, milliseconds: float) -> int:
        return max(1, round(milliseconds * 1e-3 / max(self.seconds_per_product, 1e-9)))

    def run(self, products: int) -> None:
        for _ in range(products):
            torch.mm(self.a, self.b, out=self.out)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def measure(
    job: Job, on_row: Callable[[Sequence[CommMeasurement]], None]
) -> tuple[list[CommMeasurement], Outcome]:
    """Every measurement of the request on this rank, and how the pass ended: ok; error (a wrong result, a failed
    collective); interrupted (SIGTERM, Ctrl-C), keeping what was measured before."""
    measuring = Measuring(job, on_row)
    try:
        with TERMINATION.measuring():
            measuring.run()
    except (RunInterrupted, KeyboardInterrupt):
        done = len(measuring.measurements)
        return measuring.measurements, Outcome(
            status="interrupted", message=f"stopped by a signal after {done} measurement(s); they are kept"
        )
    except Exception as exc:  # noqa: BLE001 - the job's ending, recorded with what was measured
        return measuring.measurements, Outcome(
            status="error", message=_short(exc), traceback=traceback.format_exc(limit=20)
        )
    found = summarise(measuring.measurements)
    wrong = any(m.status in ("wrong", "error") for m in measuring.measurements)
    return measuring.measurements, Outcome(status="error" if wrong else "ok", message=found)
