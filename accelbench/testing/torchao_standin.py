"""A faithful stand-in for the part of torchao's API FP8 training uses (``torchao.float8``), for tests on machines
without an FP8 GPU or torchao.

It follows torchao 0.18's documented behaviour, not just its names: ``Float8LinearConfig.from_recipe_name`` accepts
only the recipe names torchao defines (and asserts, as torchao does, on another); ``convert_to_float8_training``
walks the module tree post-order, calls ``module_filter_fn(module, fqn)`` for every ``nn.Linear`` and swaps those it
accepts for a ``Float8Linear`` (an ``nn.Linear`` subclass sharing the original weight and bias), in place, returning
the module; a linear whose dimensions are not both divisible by 16 cannot run FP8 GEMMs and is refused. The forward
rounds input and weight through ``float8_e4m3fn`` with one dynamic scale per tensor (straight-through gradients), so
training runs for real on a CPU; it measures nothing and stands in for no timing.
"""

from __future__ import annotations

import enum
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

E4M3_MAX = 448.0


class Float8LinearRecipeName(enum.Enum):
    TENSORWISE = "tensorwise"
    ROWWISE = "rowwise"
    ROWWISE_WITH_GW_HP = "rowwise_with_gw_hp"


@dataclass(frozen=True)
class Float8LinearConfig:
    recipe: Float8LinearRecipeName = Float8LinearRecipeName.TENSORWISE

    @staticmethod
    def from_recipe_name(recipe_name: Float8LinearRecipeName | str) -> Float8LinearConfig:
        if isinstance(recipe_name, str):
            valid_names = [n.value for n in Float8LinearRecipeName]
            assert recipe_name in valid_names, f"recipe_name {recipe_name} not in valid names {valid_names}"
            recipe_name = Float8LinearRecipeName(recipe_name)
        return Float8LinearConfig(recipe=recipe_name)


def _through_fp8(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to e4m3 with one dynamic scale, gradients straight through."""
    scale = E4M3_MAX / x.detach().abs().amax().clamp(min=1e-12)
    rounded = (x.detach() * scale).to(torch.float8_e4m3fn).to(x.dtype) / scale
    return x + (rounded - x.detach())


class Float8Linear(torch.nn.Linear):
    config: Float8LinearConfig

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(input.device.type):  # as torchao: compute in the autocast dtype
            dtype = torch.get_autocast_dtype(input.device.type)
            input = input.to(dtype)
            weight, bias = self.weight.to(dtype), self.bias.to(dtype) if self.bias is not None else None
        else:
            weight, bias = self.weight, self.bias
        with torch.autocast(input.device.type, enabled=False):
            return torch.nn.functional.linear(_through_fp8(input), _through_fp8(weight), bias)

    @classmethod
    def from_float(cls, mod: torch.nn.Linear, config: Float8LinearConfig | None = None) -> Float8Linear:
        if mod.in_features % 16 or mod.out_features % 16:
            raise RuntimeError(
                f"Float8Linear({mod.in_features}, {mod.out_features}): FP8 GEMMs need both dimensions divisible by 16"
            )
        with torch.device("meta"):
            new = cls(mod.in_features, mod.out_features, bias=False)
        new.weight = mod.weight
        new.bias = mod.bias
        new.config = config or Float8LinearConfig()
        return new


def convert_to_float8_training(
    module: torch.nn.Module,
    *,
    module_filter_fn: Callable[[torch.nn.Module, str], bool] | None = None,
    config: Float8LinearConfig | None = None,
) -> torch.nn.Module:
    config = config or Float8LinearConfig()
    if isinstance(module, torch.nn.Linear) and (module_filter_fn is None or module_filter_fn(module, "")):
        return Float8Linear.from_float(module, config)

    def visit(mod: torch.nn.Module, fqn: str, parent: torch.nn.Module | None) -> None:
        for name, child in list(mod.named_children()):
            visit(child, f"{fqn}.{name}" if fqn else name, mod)
        if isinstance(mod, torch.nn.Linear) and (module_filter_fn is None or module_filter_fn(mod, fqn)):
            assert parent is not None
            setattr(parent, fqn.split(".")[-1], Float8Linear.from_float(mod, config))

    visit(module, "", None)
    return module


def install(monkeypatch: Any) -> types.ModuleType:
    """Install the stand-in as ``torchao`` and ``torchao.float8`` for one test (pytest's ``monkeypatch``)."""
    package = types.ModuleType("torchao")
    float8 = types.ModuleType("torchao.float8")
    for name in ("Float8LinearConfig", "Float8LinearRecipeName", "convert_to_float8_training"):
        setattr(float8, name, globals()[name])
    package.float8 = float8  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchao", package)
    monkeypatch.setitem(sys.modules, "torchao.float8", float8)
    return float8


def remove(monkeypatch: Any) -> None:
    """Make ``import torchao`` fail for one test, as on a host without it."""
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
