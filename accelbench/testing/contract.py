"""The backend contract: one pytest class every backend plugin subclasses (see :mod:`accelbench.testing`).

Everything goes through the real :class:`~accelbench.plugins.PluginHost` and the real ``accelbench`` command, so
what passes here is what users get. A test that needs the device and finds none skips with a reason that starts
"NOT PROVEN" and says what it could not prove ("no <backend> device on this machine: ..."); the kit's pytest plugin
lists them all at the end of the session, so a run without the device never reads as a pass of the whole contract.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from accelbench.config import RunConfig
from accelbench.contract import (
    CONTRACT_VERSION,
    MX_PRECISIONS,
    PRECISIONS,
    Backend,
    BackendInfo,
    DeviceInfo,
    EnergyReading,
    EpochReadings,
    Executor,
    ExecutorRequest,
    MemoryStats,
    PeakFigures,
    PrecisionPlan,
    RunOption,
    World,
)
from accelbench.contract.strategies import Strategy
from accelbench.engine.distributed import executor_for
from accelbench.errors import ConfigError
from accelbench.plugins import PluginHost, PluginRecord
from accelbench.results import read_record
from accelbench.testing.meaning import (
    NotProven,
    Outcome,
    check_collective_backend,
    check_local_ranks,
    check_memory,
    check_synchronize,
    declared_dtypes,
)

# The flags of tiny_config: a one-layer, 16-wide GPT on 16-character windows, batch 8, no dropout
TINY_ARGS = ("--model", "custom", "--layers", "1", "--heads", "2", "--embd", "16", "--block-size", "16",
             "--batch-size", "8", "--dropout", "0")  # fmt: skip

# Tiny sizes of the core's other workloads (seed 004's): a short real run of each through the backend
WORKLOAD_TINY_ARGS: dict[str, tuple[str, ...]] = {
    "bert": ("--workload", "bert", "--model", "bert-tiny", "--seq-len", "16", "--batch-size", "8", "--dropout", "0",
             "--data-workers", "0"),
    "llama": ("--workload", "llama", "--model", "llama-tiny", "--seq-len", "32", "--vocab-size", "512",
              "--batch-size", "4"),
    **{name: ("--workload", name, "--image-size", "32", "--batch-size", "4", "--data-workers", "0")
       for name in ("resnet50", "efficientnet-b0", "mobilenet-v3-small", "mobilenet-v3-large")},
}  # fmt: skip
NEEDS_TORCHVISION = ("resnet50", "efficientnet-b0", "mobilenet-v3-small", "mobilenet-v3-large")
# its subword tokenizer is trained with Hugging Face's tokenizers (the llama extra)
NEEDS_TOKENIZERS = ("llama",)

NOT_PROVEN = (
    "NOT PROVEN"  # the start of every skip reason for a part of the contract this machine cannot check
)
DETECT_BUDGET_S = 30.0  # "cheap": a probe subprocess fits easily, a hung driver does not

# The dtype a precision name promises (a "-mixed" plan may run it by autocast or by casting the model).
_SIXTEEN_BIT = {
    "fp16-mixed": "float16",
    "bf16-mixed": "bfloat16",
    "fp8-tensorwise": "bfloat16",  # FP8 linears, the rest under bf16 autocast
    "fp8-rowwise": "bfloat16",
    "mxfp8": "bfloat16",  # MXFP8 linears, bfloat16 parameters
}

_RUNTIME_CHECK = """
import json, sys
from accelbench.plugins import PluginHost
import torch
backend = PluginHost(strict=False).backends[sys.argv[1]]
probe = getattr(getattr(torch, backend.info.device_type, None), "is_initialized", None)
before = probe() if callable(probe) else None
devices = backend.detect()
after = probe() if callable(probe) else None
print(json.dumps({"devices": len(devices), "error": backend.detect_error, "before": before, "after": after}))
"""


class BackendContract:
    """The contract suite. Subclass it as ``Test<Name>Contract`` and set :attr:`backend`.

    Class attributes a backend may adjust: :attr:`run_args` (the short training run's size, e.g. a batch size
    an IPU pipeline accepts), :attr:`run_precision` (default: fp32 when supported, else the first supported)
    and :attr:`run_timeout_s`.
    """

    backend: ClassVar[str] = ""
    # the plugin's module, where the kit looks for TODOs left from the template (default: the backend class's)
    run_args: ClassVar[tuple[str, ...]] = (*TINY_ARGS, "--epochs", "2", "--steps-per-epoch", "2")
    # extra run options for the other workloads' short runs (e.g. a strategy or batch an IPU pipeline accepts)
    workload_run_args: ClassVar[tuple[str, ...]] = ()
    run_precision: ClassVar[str | None] = None
    run_timeout_s: ClassVar[float] = 600.0

    # fixtures -------------------------------------------------------------------------------------------------
    @pytest.fixture(scope="class")
    @classmethod
    def contract_host(cls) -> PluginHost:
        if not cls.backend:
            pytest.fail(f"{cls.__name__} must set `backend` to the backend name it checks")
        return PluginHost(strict=False)

    @pytest.fixture(scope="class")
    @classmethod
    def contract_record(cls, contract_host: PluginHost) -> PluginRecord:
        for record in contract_host.records:
            if record.backend is not None and record.backend.name == cls.backend:
                return record
        failed = "; ".join(f"{r.name} ({r.distribution}): {r.error}" for r in contract_host.failed) or "none"
        pytest.fail(
            f"no installed plugin provides backend {cls.backend!r} (plugins that failed to load: {failed}); "
            "install the plugin's distribution, e.g. `pip install -e .`"
        )

    @pytest.fixture(scope="class")
    @classmethod
    def contract_backend(cls, contract_host: PluginHost, contract_record: PluginRecord) -> Backend:
        return contract_host.backends[cls.backend]

    @pytest.fixture(scope="class")
    @classmethod
    def contract_devices(cls, contract_backend: Backend) -> list[DeviceInfo]:
        devices = contract_backend.detect()
        if not devices:
            why = (
                f" (detection failed: {contract_backend.detect_error})"
                if contract_backend.detect_error
                else ""
            )
            pytest.skip(f"{NOT_PROVEN}: no {cls.backend} device on this machine{why}")
        return devices

    @pytest.fixture(scope="class")
    @classmethod
    def contract_device(cls, contract_backend: Backend, contract_devices: list[DeviceInfo]) -> torch.device:
        return contract_backend.setup_device(World(), {})

    # loading and documentation --------------------------------------------------------------------------------
    def test_plugin_is_installed_and_active(self, contract_record: PluginRecord) -> None:
        assert contract_record.status == "active", contract_record.error
        assert contract_record.distribution, "the plugin must be registered by an installed distribution"
        assert not contract_record.warnings, contract_record.warnings

    def test_plugin_declares_the_contract_it_implements(
        self, contract_host: PluginHost, contract_record: PluginRecord
    ) -> None:
        assert contract_record.contract is not None, (
            'declare accelbench_contract = "MAJOR.MINOR" on the plugin'
        )
        assert contract_record.contract.split(".")[0] == CONTRACT_VERSION.split(".")[0], (
            contract_record.contract,
            CONTRACT_VERSION,
        )

    def test_backend_subclasses_the_contract_and_documents_itself(self, contract_backend: Backend) -> None:
        cls = type(contract_backend)
        assert isinstance(contract_backend, Backend), (
            f"{cls.__name__} must subclass accelbench.contract.Backend"
        )
        assert inspect.getdoc(cls) and inspect.getdoc(cls) != inspect.getdoc(Backend), (
            f"{cls.__name__} needs a docstring saying what it implements"
        )
        stock = {name for name in dir(Backend) if not name.startswith("_")}
        for name in dir(cls):
            if name.startswith("_") or name in stock or not callable(getattr(cls, name)):
                continue
            assert not name.startswith("accelbench_"), (
                f"{cls.__name__}.{name} is a contract 2.x hook name: in 3.0 it is a method without the prefix"
            )
        for name in (
            "detect",
            "collective",
            "check_precision",
            "check_strategy",
        ):  # the host relies on these as written
            assert getattr(cls, name) is getattr(Backend, name), f"{cls.__name__} must not override {name}"
        for name in stock & set(vars(cls)):
            if not inspect.isfunction(inspect.getattr_static(Backend, name)):
                continue  # info, strategies, name: attributes, not methods
            mine, theirs = inspect.signature(getattr(cls, name)), inspect.signature(getattr(Backend, name))
            assert list(mine.parameters) == list(theirs.parameters), (
                f"{cls.__name__}.{name}{mine} must take the contract's parameters {theirs}"
            )

    def test_no_template_todo_is_left(self, contract_backend: Backend) -> None:
        """The template's output raises NotImplementedError("TODO: ...") where a vendor must write code: a
        backend with one of those left is not conformant, whatever else passes."""
        import re

        source = inspect.getsource(inspect.getmodule(type(contract_backend)) or type(contract_backend))
        # a raise that a formatter split over lines counts as well as one on a single line
        todos = [
            " ".join(m.group(0).split())
            for m in re.finditer(r"NotImplementedError\(\s*[\"']TODO[^\"']*", source)
        ]
        todos += [line.strip() for line in source.splitlines() if line.strip().startswith("# TODO")]
        assert not todos, "the template's TODOs are not done:\n" + "\n".join(todos)

    def test_backend_info_names_a_torch_device_type(self, contract_backend: Backend) -> None:
        info = contract_backend.info
        assert isinstance(info, BackendInfo) and info.name == self.backend
        # a torch device type's form; torch itself may learn the type only from the vendor's package, which the
        # device-less tier does not need (device_kind() imports it; test_device_binds_to_the_declared_type binds it)
        assert re.fullmatch(r"[a-z][a-z0-9_]*", info.device_type), (
            f"device_type {info.device_type!r}: torch's name of the device type ('cuda', 'xpu', 'hpu', 'npu', ...)"
        )
        assert info.device_unit.strip(), "say what one device is (GPU, GCD, tile, IPU, ...)"

    def test_run_options_are_well_formed(self, contract_host: PluginHost, contract_backend: Backend) -> None:
        from accelbench.cli import build_parser

        for option in contract_backend.run_options():
            assert isinstance(option, RunOption), option
            assert option.backend == self.backend, f"--{option.name} says it is read by {option.backend!r}"
            assert option.help.strip(), f"--{option.name} needs a help text"
        build_parser(contract_host.run_options())  # argparse raises if an option clashes with another

    # detection ------------------------------------------------------------------------------------------------
    def test_detection_returns_devices_without_raising(self, contract_backend: Backend) -> None:
        start = time.perf_counter()
        devices = contract_backend.detect()
        elapsed = time.perf_counter() - start
        assert contract_backend.detect_error is None, f"detection raised: {contract_backend.detect_error}"
        assert isinstance(devices, list) and all(isinstance(d, DeviceInfo) for d in devices), devices
        indices = [d.index for d in devices]
        assert len(set(indices)) == len(indices) and all(i >= 0 for i in indices), indices
        assert elapsed < DETECT_BUDGET_S, f"detection took {elapsed:.1f} s; it must be cheap"
        assert contract_backend.detect() == devices, "detection must give the same answer twice"

    @pytest.mark.slow
    def test_detection_initialises_no_device_runtime(self) -> None:
        proc = subprocess.run(
            [sys.executable, "-c", _RUNTIME_CHECK, self.backend],
            capture_output=True,
            text=True,
            env=_child_env(),
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        assert answer["error"] is None, f"detection raised: {answer['error']}"
        if answer["before"] is None:
            pytest.skip("torch has no is_initialized() for this device type: nothing to check")
        if answer["before"]:
            pytest.skip("torch reports this device type initialised before detection (CPU): nothing to check")
        assert answer["after"] is False, "detection initialised the device runtime in the calling process"

    # with a device --------------------------------------------------------------------------------------------
    def test_device_binds_to_the_declared_type(
        self, contract_backend: Backend, contract_device: torch.device
    ) -> None:
        assert isinstance(contract_device, torch.device)
        assert contract_device.type == contract_backend.info.device_type
        kind = contract_backend.device_kind()  # the index-less type the core asks about before binding
        assert isinstance(kind, torch.device) and kind.type == contract_device.type and kind.index is None, (
            kind
        )

    def test_runtime_versions_are_text(
        self, contract_backend: Backend, contract_devices: list[DeviceInfo]
    ) -> None:
        versions = contract_backend.runtime_versions()
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in versions.items()), versions

    def test_declared_precisions_make_consistent_plans(
        self, contract_backend: Backend, contract_device: torch.device
    ) -> None:
        supported = contract_backend.supported_precisions(contract_device)
        assert supported, "a backend must support at least one precision"
        assert len(set(supported)) == len(supported), supported
        assert set(supported) <= set(PRECISIONS), (
            f"unknown precision names: {set(supported) - set(PRECISIONS)}"
        )
        # the launcher asks before any device is bound, with an index-less device of the backend's type
        unbound = contract_backend.supported_precisions(contract_backend.device_kind())
        assert set(unbound) <= set(supported), (unbound, supported)
        for name in supported:
            plan = contract_backend.precision_plan(name, contract_device, {})
            assert isinstance(plan, PrecisionPlan) and plan.name == name, plan
            assert plan.matmul_math.strip(), f"{name}: say which math fp32 matmuls really use"
            if name == "fp32":
                assert (plan.param_dtype, plan.autocast_dtype) == ("float32", None), plan
            elif name == "bf16-true":
                assert (plan.param_dtype, plan.autocast_dtype) == ("bfloat16", None), plan
            else:
                want = _SIXTEEN_BIT[name]
                assert want in (plan.autocast_dtype, plan.param_dtype), f"{name} runs no {want}: {plan}"
                if name.startswith("fp8-"):
                    assert plan.fp8_recipe == name.removeprefix("fp8-"), f"{name} converts no linear: {plan}"
                if name in MX_PRECISIONS:
                    assert plan.fp8_recipe and plan.mx is not None, f"{name} records no MX format: {plan}"

    def test_undeclared_precision_is_refused(
        self, contract_backend: Backend, contract_device: torch.device
    ) -> None:
        missing = [p for p in PRECISIONS if p not in contract_backend.supported_precisions(contract_device)]
        if not missing:
            pytest.skip("the device supports every precision accelbench knows")
        with pytest.raises(ConfigError, match="does not support precision"):
            contract_backend.check_precision(missing[0], contract_device)

    def test_declared_strategies_build_executors(
        self, contract_host: PluginHost, contract_backend: Backend, contract_device: torch.device
    ) -> None:
        strategies = contract_backend.supported_strategies(contract_device)
        assert strategies and len(set(strategies)) == len(strategies), strategies
        assert set(strategies) <= set(contract_backend.strategies), (
            f"supported_strategies names {sorted(set(strategies) - set(contract_backend.strategies))}, which the "
            "class attribute `strategies` (what `run --help` lists) lacks"
        )
        # Each builds an executor, or is refused up front with a ConfigError saying what is missing on this
        # installation (the core refuses DeepSpeed strategies that way when DeepSpeed is not installed).
        plan = contract_backend.precision_plan(
            self._precision(contract_backend, contract_device), contract_device, {}
        )
        refused: dict[str, str] = {}
        # tensor/pipeline layouts name several devices (a layout of one is refused as a configuration); built in
        # this single process, their executor refuses the layout, saying why
        layouts: dict[str, dict[str, Any]] = {"tp": {"devices": 2}, "pp": {"devices": 2}}
        layouts["mesh"] = {"devices": 4, "mesh": "tp=2,pp=2"}
        for strategy in strategies:
            config = contract_host.resolve(self._config(strategy=strategy, **layouts.get(strategy, {})))
            request = ExecutorRequest(
                config=config,
                device=contract_device,
                precision=plan,
                world=World(),
                backend=contract_backend,
                units=contract_host.workload(config.workload).units(config),
                default_executor=executor_for,
            )
            try:
                executor = contract_backend.executor(request)
            except (
                ConfigError
            ) as exc:  # an optional engine not installed here (DeepSpeed): refused, and says why
                assert str(exc).strip(), f"strategy {strategy!r} was refused without a reason"
                refused[strategy] = str(exc)
                continue
            assert isinstance(executor, Executor), f"strategy {strategy!r} built {type(executor).__name__}"
            executor.close()
        assert len(refused) < len(strategies), f"no declared strategy builds an executor here: {refused}"

    def test_undeclared_strategy_is_refused(
        self, contract_backend: Backend, contract_device: torch.device
    ) -> None:
        with pytest.raises(ConfigError, match="does not support strategy"):
            contract_backend.check_strategy("no-such-strategy", contract_device)

    def test_epoch_readings_shape(self, contract_backend: Backend, contract_device: torch.device) -> None:
        contract_backend.epoch_start(contract_device)  # the runner: an epoch starts now
        contract_backend.synchronize(contract_device)
        readings = contract_backend.epoch_end(contract_device)
        assert isinstance(readings, EpochReadings), readings
        stats = readings.memory
        assert isinstance(stats, MemoryStats), stats
        assert stats.source.strip(), "say what peak_bytes measures"
        for field in ("peak_bytes", "peak_reserved_bytes", "device_used_bytes", "total_bytes"):
            value = getattr(stats, field)
            assert value is None or (isinstance(value, int) and value >= 0), (field, value)
        if stats.peak_bytes is not None and stats.total_bytes:
            assert stats.peak_bytes <= stats.total_bytes, stats
        if readings.energy is not None:  # a real counter: non-negative joules, its domain and source named
            assert isinstance(readings.energy, EnergyReading) and readings.energy.domain.strip(), (
                readings.energy
            )
            assert readings.energy.source.strip(), readings.energy
        for key, value in readings.telemetry.items():
            assert isinstance(key, str) and isinstance(value, (int, float)) and not isinstance(value, bool), (
                key,
                value,
            )
            assert math.isfinite(value), (key, value)

    # what the readings mean (accelbench.testing.meaning): each check does something whose effect is known
    def test_memory_peak_covers_an_allocation_and_resets(
        self, contract_backend: Backend, contract_device: torch.device
    ) -> None:
        _outcome(check_memory(contract_backend, contract_device))

    def test_synchronize_waits_for_queued_work(
        self, contract_backend: Backend, contract_device: torch.device
    ) -> None:
        _outcome(check_synchronize(contract_backend, contract_device))

    def test_collective_backend_reduces_the_declared_dtypes(
        self, contract_backend: Backend, contract_device: torch.device
    ) -> None:
        _outcome(
            check_collective_backend(
                contract_backend, contract_device, declared_dtypes(contract_backend, contract_device)
            )
        )

    def test_local_ranks_get_devices_of_their_own(
        self, contract_backend: Backend, contract_devices: list[DeviceInfo]
    ) -> None:
        _outcome(check_local_ranks(contract_backend, contract_devices))

    def test_peak_figures_are_positive_or_unknown(
        self, contract_backend: Backend, contract_device: torch.device, contract_devices: list[DeviceInfo]
    ) -> None:
        for name in contract_backend.supported_precisions(contract_device):
            plan = contract_backend.precision_plan(name, contract_device, {})
            peak = contract_backend.peak_figures(contract_devices[0], plan)
            if peak is None:
                continue
            assert isinstance(peak, PeakFigures) and peak.flops_per_s > 0 and peak.source.strip(), peak
            assert peak.memory_bandwidth_bytes_per_s is None or peak.memory_bandwidth_bytes_per_s > 0, peak

    @pytest.mark.slow
    def test_short_training_run(
        self, contract_backend: Backend, contract_device: torch.device, tmp_path: Path
    ) -> None:
        precision = self._precision(contract_backend, contract_device)
        command = [sys.executable, "-m", "accelbench.cli", "run", "--backend", self.backend, *self.run_args]
        command += ["--precision", precision, "--output-dir", str(tmp_path), "--quiet"]
        proc = subprocess.run(
            command, capture_output=True, text=True, env=_child_env(), timeout=self.run_timeout_s, check=False
        )
        assert proc.returncode == 0, f"`{' '.join(command[2:])}` failed:\n{proc.stderr[-3000:]}"
        files = sorted(tmp_path.glob("*.json"))
        assert len(files) == 1, files
        record = read_record(files[0])
        assert record.outcome.status == "ok", record.outcome
        assert record.backend.info.name == self.backend and record.precision is not None
        assert record.precision.name == precision
        epochs = record.metrics.epochs if record.metrics else []
        expected = _expected_epochs(self.run_args)
        assert len(epochs) == expected[0] and all(e.steps == expected[1] for e in epochs), epochs
        assert all(e.loss is not None and math.isfinite(e.loss) for e in epochs), [e.loss for e in epochs]

    @pytest.mark.parametrize("workload", sorted(WORKLOAD_TINY_ARGS))
    @pytest.mark.slow
    def test_short_training_run_of_each_workload(
        self, workload: str, contract_backend: Backend, contract_device: torch.device, tmp_path: Path
    ) -> None:
        """BERT, Llama and the image models at tiny sizes train through this backend too (the image models need
        the ``vision`` extra, Llama the ``llama`` extra: they skip without torchvision or tokenizers)."""
        if workload in NEEDS_TORCHVISION and importlib.util.find_spec("torchvision") is None:
            pytest.skip("torchvision not installed (pip install 'accelbench[vision]')")
        if workload in NEEDS_TOKENIZERS and importlib.util.find_spec("tokenizers") is None:
            pytest.skip("tokenizers not installed (pip install 'accelbench[llama]')")
        precision = self._precision(contract_backend, contract_device)
        command = [sys.executable, "-m", "accelbench.cli", "run", "--backend", self.backend]
        command += [
            *WORKLOAD_TINY_ARGS[workload],
            "--epochs",
            "2",
            "--steps-per-epoch",
            "2",
            *self.workload_run_args,
        ]
        command += ["--precision", precision, "--output-dir", str(tmp_path), "--quiet"]
        proc = subprocess.run(
            command, capture_output=True, text=True, env=_child_env(), timeout=self.run_timeout_s, check=False
        )
        assert proc.returncode == 0, f"`{' '.join(command[2:])}` failed:\n{proc.stderr[-3000:]}"
        record = read_record(next(tmp_path.glob("*.json")))
        assert record.outcome.status == "ok" and record.config.workload == workload, record.outcome
        epochs = record.metrics.epochs if record.metrics else []
        assert [e.steps for e in epochs] == [2, 2] and all(
            e.loss is not None and math.isfinite(e.loss) for e in epochs
        )

    # the training step's contract ------------------------------------------------------------------------------
    def test_step_boundaries_are_called_in_order(
        self,
        contract_host: PluginHost,
        contract_backend: Backend,
        contract_device: torch.device,
        tmp_path: Path,
    ) -> None:
        """Through the real runner, in this process: every step calls ``after_backward`` once per micro-batch,
        then ``after_optimizer_step`` once, then ``end_of_step`` once (a lazy device cuts its graph there); the
        compile step, the epochs' synchronisations and the gradient probe after each epoch come outside steps."""
        from accelbench.engine.runner import run

        calls: list[str] = []
        names = ("after_backward", "after_optimizer_step", "end_of_step")
        originals = {name: getattr(contract_backend, name) for name in names}

        def recorder(name: str) -> Any:
            def record(device: torch.device) -> None:
                calls.append(name)
                originals[name](device)

            return record

        for name in names:
            setattr(contract_backend, name, recorder(name))
        try:
            for grad_accum in (1, 2):
                calls.clear()
                config = self._config(
                    precision=self._precision(contract_backend, contract_device), epochs=2, steps_per_epoch=2,
                    grad_accum=grad_accum, output_dir=tmp_path / f"accum{grad_accum}",
                    no_tensor_peak=True,  # the 4 timed steps only (the untimed tensor-peak step makes a fifth)
                    no_calibration=True,  # the steps are counted here, not the prediction (a device's first: seconds)
                )  # fmt: skip
                record, _, status = run(config, contract_host)
                assert status == "ok", record.outcome if record else status
                step = ["after_backward"] * grad_accum + ["after_optimizer_step", "end_of_step"]
                # after each epoch, outside its steps, an executor that probes its gradients (the core's:
                # Executor.gradient_norm) makes one backward with no optimizer step, and cuts a lazy graph after it
                probed = (
                    record is not None and record.quality is not None and record.quality.epochs[0].grad_norm
                )
                probe = ["after_backward", "end_of_step"] if probed else []
                assert calls == (step * 2 + probe) * 2, (
                    f"--grad-accum {grad_accum}: the step boundaries of 2 epochs of 2 steps came as {calls}; each "
                    f"step must call {step}"
                    + (f", and the gradient probe after each epoch {probe}" if probe else "")
                )
        finally:
            for name in names:
                setattr(contract_backend, name, originals[name])

    @pytest.mark.slow
    def test_short_training_run_with_gradient_accumulation(
        self, contract_backend: Backend, contract_device: torch.device, tmp_path: Path
    ) -> None:
        record = self._cli_run(contract_backend, contract_device, tmp_path, "--grad-accum", "2")
        assert record.executor.get("grad_accum", 2) == 2, record.executor

    @pytest.mark.slow
    def test_compiled_training_run(
        self, contract_backend: Backend, contract_device: torch.device, tmp_path: Path
    ) -> None:
        """``--compile`` with the backend's compiler (:meth:`Backend.compile_backend`), or refused up front where
        the backend says it cannot compile."""
        compiler = contract_backend.compile_backend()
        if compiler is None:
            proc = self._cli(contract_backend, contract_device, tmp_path, "--compile")
            assert proc.returncode == 2 and "compile" in proc.stderr, proc.stderr[-2000:]
            return
        record = self._cli_run(contract_backend, contract_device, tmp_path, "--compile")
        assert record.metrics is not None and record.metrics.compile_s is not None, record.metrics
        assert record.executor.get("compile_backend", compiler) == compiler, record.executor

    @pytest.mark.slow
    def test_two_process_training_run(
        self, contract_backend: Backend, contract_devices: list[DeviceInfo], contract_device: torch.device,
        tmp_path: Path,
    ) -> None:  # fmt: skip
        """Two ranks over the backend's collective (``--strategy ddp --devices 2``), each rank's log in the record."""
        from accelbench.contract import NO_COLLECTIVE

        if contract_backend.collective_backend(contract_device) is NO_COLLECTIVE:
            pytest.skip("the backend replicates without torch.distributed (no collective): nothing to check")
        if Strategy.DDP not in contract_backend.supported_strategies(contract_device):
            pytest.skip("the backend declares no ddp strategy")
        if contract_backend.info.device_type != "cpu" and len(contract_devices) < 2:
            pytest.skip(
                f"{NOT_PROVEN}: two-process training needs 2 {self.backend} devices, this machine has 1"
            )
        record = self._cli_run(
            contract_backend,
            contract_device,
            tmp_path,
            "--strategy",
            Strategy.DDP,
            "--devices",
            "2",
            timeout_factor=2,
        )
        ranks = record.metrics.ranks if record.metrics else []
        assert record.world_size == 2 and len(ranks) == 2, (record.world_size, ranks)

    # helpers --------------------------------------------------------------------------------------------------
    def _precision(self, backend: Backend, device: torch.device) -> str:
        if self.run_precision is not None:
            return self.run_precision
        supported = backend.supported_precisions(device)
        return "fp32" if "fp32" in supported else supported[0]

    def _config(self, **values: Any) -> RunConfig:
        return tiny_config(backend=self.backend, **values)

    def _cli(
        self, backend: Backend, device: torch.device, out: Path, *extra: str, timeout_factor: float = 1
    ) -> subprocess.CompletedProcess[str]:
        command = [
            sys.executable,
            "-m",
            "accelbench.cli",
            "run",
            "--backend",
            self.backend,
            *self.run_args,
            *extra,
        ]
        command += ["--precision", self._precision(backend, device), "--output-dir", str(out), "--quiet"]
        return subprocess.run(
            command, capture_output=True, text=True, env=_child_env(), timeout=self.run_timeout_s * timeout_factor,
            check=False,
        )  # fmt: skip

    def _cli_run(
        self, backend: Backend, device: torch.device, out: Path, *extra: str, timeout_factor: float = 1
    ) -> Any:
        proc = self._cli(backend, device, out, *extra, timeout_factor=timeout_factor)
        assert proc.returncode == 0, f"`accelbench run {' '.join(extra)}` failed:\n{proc.stderr[-3000:]}"
        record = read_record(next(out.glob("*.json")))
        assert record.outcome.status == "ok", record.outcome
        epochs = record.metrics.epochs if record.metrics else []
        assert epochs and all(e.loss is not None and math.isfinite(e.loss) for e in epochs), epochs
        return record


def tiny_config(**values: Any) -> RunConfig:
    """A one-layer, 16-wide GPT on 16-character windows, batch 8: a real training run in seconds on any device.
    ``values`` override or add RunConfig fields (epochs, steps_per_epoch, precision, output_dir, ...) and the GPT's
    options (``block_size``, ``dropout``, ...), which land in ``workload_options``."""
    options: dict[str, Any] = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, dropout=0.0)
    options.update(values.pop("workload_options", {}))
    for name in list(values):
        if name not in RunConfig.model_fields:
            options[name] = values.pop(name)
    base: dict[str, Any] = dict(model="custom", batch_size=8)
    return RunConfig(**{**base, **values, "workload_options": options})


def _outcome(outcome: Outcome) -> None:
    """A check's outcome as a test's: a violation has failed already; what could not be proven here skips."""
    if isinstance(outcome, NotProven):
        pytest.skip(f"{NOT_PROVEN}: {outcome.check}: {outcome.why}")


def _child_env() -> dict[str, str]:
    """This interpreter's environment and import path, so a child process loads the same plugins."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _expected_epochs(args: tuple[str, ...]) -> tuple[int, int]:
    """(epochs, steps per epoch) the run arguments ask for."""

    def value(flag: str, default: int) -> int:
        return int(args[args.index(flag) + 1]) if flag in args else default

    return value("--epochs", 2), value("--steps-per-epoch", 2)
