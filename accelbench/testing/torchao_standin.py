"""A faithful stand-in for the part of torchao's API FP8 training uses (``torchao.float8``, and for MX training
``torchao.quantization.quantize_`` with ``torchao.prototype.moe_training``'s MXFP8 config), for tests on machines
without an FP8 GPU or torchao.

It follows torchao 0.18's documented behaviour, not just its names: ``Float8LinearConfig.from_recipe_name`` accepts
only the recipe names torchao defines (and asserts, as torchao does, on another); ``convert_to_float8_training``
walks the module tree post-order, calls ``module_filter_fn(module, fqn)`` for every ``nn.Linear`` and swaps those it
accepts for a ``Float8Linear`` (an ``nn.Linear`` subclass sharing the original weight and bias), in place, returning
the module; a linear whose dimensions are not both divisible by 16 cannot run FP8 GEMMs and is refused. The FP8
dtypes are torchao's ``Float8TypeConfig`` choice, made when the stand-in is installed as torchao makes it when
``torchao.float8.config`` is imported: ``float8_e4m3fnuz``/``float8_e5m2fnuz`` when ``torch.version.hip`` is set, a
GPU is available and device 0's ``gcnArchName`` names gfx940, gfx941 or gfx942 (an MI300), else
``float8_e4m3fn``/``float8_e5m2``; each recipe's ``CastConfig.target_dtype`` is filled from them as torchao's
``Float8LinearConfig.__post_init__`` does (tensorwise: e4m3 input and weight, e5m2 grad_output; rowwise: e4m3 for
all three). The forward rounds input and weight through the config's e4m3 dtype with one dynamic scale per tensor
(straight-through gradients), so training runs for real on a CPU; it measures nothing and stands in for no timing.

MX training follows torchao 0.18's ``torchao.prototype.moe_training``: ``MXFP8TrainingRecipe`` names its three
recipes (another name is a ValueError, as the enum raises), ``MXFP8TrainingOpConfig.from_recipe`` fills the config
as torchao does (AUTO or EMULATED kernels, RCEIL scales, weight gradient in MXFP8 or high precision);
``quantize_(model, config, filter_fn)`` calls ``filter_fn(module, fqn)`` pre-order from the root (fqn ``""``), and for
a module it accepts wraps every parameter of it and below in ``MXFP8TrainingWeightWrapperTensor`` (the module stays
an ``nn.Linear``) without visiting its children again. The wrapper's ``F.linear`` override computes
``input @ weight.T`` through ``mx_mm``, dropping the bias as torchao 0.18 does, and asserts, as torchao's ``to_mx``
does, that the last dimension of every tensor it casts is divisible by the block size 32: in and out features, and in
the weight gradient the rows (samples x tokens); with the AUTO kernels its Triton cast asserts bfloat16 input and
weight (so an MXFP8 model's parameters are bfloat16, not float32 under autocast). Each operand is rounded to ``float8_e4m3fn`` in blocks of 32 with a
power-of-two scale rounded up (RCEIL); the output is bfloat16 with the AUTO kernels (torchao's ``_scaled_mm``
``out_dtype``), the input's dtype when emulated.
"""

from __future__ import annotations

import enum
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

MI300_ARCHS = ("gfx940", "gfx941", "gfx942")


def _is_mi300() -> bool:
    """torchao.utils.is_MI300: a ROCm build with a GPU whose device 0 is gfx940/941/942."""
    if not (torch.cuda.is_available() and torch.version.hip is not None):
        return False
    arch = torch.cuda.get_device_properties(0).gcnArchName
    return any(name in arch for name in MI300_ARCHS)


def _type_pair() -> tuple[torch.dtype, torch.dtype]:
    """torchao's Float8TypeConfig: the (e4m3, e5m2) pair it casts to, FNUZ on an MI300, OCP elsewhere."""
    if torch.version.hip and torch.cuda.is_available() and _is_mi300():
        return torch.float8_e4m3fnuz, torch.float8_e5m2fnuz
    return torch.float8_e4m3fn, torch.float8_e5m2


e4m3_dtype, e5m2_dtype = _type_pair()


class Float8LinearRecipeName(enum.Enum):
    TENSORWISE = "tensorwise"
    ROWWISE = "rowwise"
    ROWWISE_WITH_GW_HP = "rowwise_with_gw_hp"


@dataclass(frozen=True)
class CastConfig:
    target_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        assert self.target_dtype is None or (
            self.target_dtype.is_floating_point and self.target_dtype.itemsize == 1
        ), "must specify a 8-bit floating-point dtype"


@dataclass(frozen=True)
class Float8LinearConfig:
    recipe: Float8LinearRecipeName = Float8LinearRecipeName.TENSORWISE
    cast_config_input: CastConfig = CastConfig()
    cast_config_weight: CastConfig = CastConfig()
    cast_config_grad_output: CastConfig = CastConfig()

    def __post_init__(self) -> None:
        defaults = (("input", e4m3_dtype), ("weight", e4m3_dtype), ("grad_output", e5m2_dtype))
        for operand, dtype in defaults:  # as torchao: an unset target_dtype takes the type config's
            cast = getattr(self, f"cast_config_{operand}")
            if cast.target_dtype is None:
                object.__setattr__(self, f"cast_config_{operand}", CastConfig(target_dtype=dtype))

    @staticmethod
    def from_recipe_name(recipe_name: Float8LinearRecipeName | str) -> Float8LinearConfig:
        if isinstance(recipe_name, str):
            valid_names = [n.value for n in Float8LinearRecipeName]
            assert recipe_name in valid_names, f"recipe_name {recipe_name} not in valid names {valid_names}"
            recipe_name = Float8LinearRecipeName(recipe_name)
        if recipe_name is Float8LinearRecipeName.TENSORWISE:
            return Float8LinearConfig(recipe=recipe_name)
        e4m3 = CastConfig(target_dtype=e4m3_dtype)  # the rowwise recipes cast grad_output to e4m3 as well
        return Float8LinearConfig(
            recipe=recipe_name, cast_config_input=e4m3, cast_config_weight=e4m3, cast_config_grad_output=e4m3
        )


def _through_fp8(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` rounded to the FP8 ``dtype`` with one dynamic scale, gradients straight through."""
    scale = torch.finfo(dtype).max / x.detach().abs().amax().clamp(min=1e-12)
    rounded = (x.detach() * scale).to(dtype).to(x.dtype) / scale
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
        fp8_input = self.config.cast_config_input.target_dtype
        fp8_weight = self.config.cast_config_weight.target_dtype
        assert fp8_input is not None and fp8_weight is not None  # set by the config's __post_init__
        with torch.autocast(input.device.type, enabled=False):
            return torch.nn.functional.linear(
                _through_fp8(input, fp8_input), _through_fp8(weight, fp8_weight), bias
            )

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


class KernelPreference(enum.Enum):
    AUTO = "auto"
    TORCH = "torch"
    EMULATED = "emulated"


class ScaleCalculationMode(enum.Enum):
    FLOOR = "floor"
    RCEIL = "rceil"
    CEIL = "ceil"
    EVEN = "even"


class MXFP8TrainingRecipe(enum.Enum):
    MXFP8_RCEIL = "mxfp8_rceil"
    MXFP8_RCEIL_WGRAD_WITH_HP = "mxfp8_rceil_wgrad_with_hp"
    MXFP8_EMULATED_RCEIL = "mxfp8_emulated_rceil"


@dataclass
class MXFP8TrainingOpConfig:
    kernel_preference: KernelPreference = KernelPreference.AUTO
    out_dtype: torch.dtype | None = torch.bfloat16
    wgrad_with_hp: bool = False
    scale_calculation_mode: ScaleCalculationMode = ScaleCalculationMode.RCEIL
    pad_token_groups_for_grouped_mm: bool = False

    @classmethod
    def from_recipe(cls, recipe: MXFP8TrainingRecipe) -> MXFP8TrainingOpConfig:
        if recipe == MXFP8TrainingRecipe.MXFP8_RCEIL:
            return cls()
        if recipe == MXFP8TrainingRecipe.MXFP8_RCEIL_WGRAD_WITH_HP:
            return cls(wgrad_with_hp=True)
        if recipe == MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL:
            return cls(kernel_preference=KernelPreference.EMULATED)
        raise ValueError(f"Unsupported MXFP8 recipe: {recipe}")


MX_BLOCK_SIZE = 32
F8E4M3_MAX = 448.0


def _to_mx(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to float8_e4m3fn in blocks of 32 along its last dimension, each with a power-of-two scale
    rounded up (RCEIL), back in float32; asserts the block rule as torchao's ``to_mx``."""
    assert x.shape[-1] % MX_BLOCK_SIZE == 0, (
        f"the last dimension of shape {x.shape} must be divisible by block_size {MX_BLOCK_SIZE}"
    )
    blocks = x.detach().float().reshape(-1, MX_BLOCK_SIZE)
    amax = blocks.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)
    scale = torch.exp2(torch.ceil(torch.log2(amax / F8E4M3_MAX)).clamp(-127, 127))
    rounded = (blocks / scale).to(torch.float8_e4m3fn).float() * scale
    return rounded.reshape(x.shape)


class mx_mm(torch.autograd.Function):  # noqa: N801 - torchao's name
    @staticmethod
    def forward(
        ctx: Any, input_hp: torch.Tensor, weight_hp: torch.Tensor, config: MXFP8TrainingOpConfig
    ) -> Any:
        with torch._C.DisableTorchFunctionSubclass(), torch.autocast(input_hp.device.type, enabled=False):
            # torchao's Triton cast to MXFP8 along dim 0 (the AUTO kernels) takes bfloat16 only
            if config.kernel_preference == KernelPreference.AUTO:
                for x in (input_hp, weight_hp):
                    assert x.dtype == torch.bfloat16, f"only bfloat16 inputs are supported, got {x.dtype}"
            ctx.save_for_backward(input_hp, weight_hp)
            ctx.config = config
            rows = input_hp.reshape(-1, input_hp.shape[-1])
            out = _to_mx(rows) @ _to_mx(weight_hp).t()
            emulated = config.kernel_preference == KernelPreference.EMULATED
            out = out.to(input_hp.dtype if emulated else torch.bfloat16)
            return out.reshape(*input_hp.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        input_hp, weight_hp = ctx.saved_tensors
        with torch._C.DisableTorchFunctionSubclass(), torch.autocast(grad_output.device.type, enabled=False):
            grad = grad_output.reshape(-1, grad_output.shape[-1]).float()
            rows = input_hp.reshape(-1, input_hp.shape[-1]).float()
            grad_input = _to_mx(grad) @ _to_mx(weight_hp.float().t().contiguous()).t()
            if ctx.config.wgrad_with_hp:
                grad_weight = grad.t() @ rows
            else:
                grad_weight = _to_mx(grad.t().contiguous()) @ _to_mx(rows.t().contiguous()).t()
            grad_input = grad_input.reshape(*input_hp.shape[:-1], grad_input.shape[-1]).to(input_hp.dtype)
            return grad_input, grad_weight.to(weight_hp.dtype), None


class MXFP8TrainingWeightWrapperTensor(torch.Tensor):
    """A parameter's data as torchao wraps it: a tensor like any other, except for the linear ops."""

    config: MXFP8TrainingOpConfig

    @staticmethod
    def __new__(cls, tensor: torch.Tensor, config: MXFP8TrainingOpConfig) -> MXFP8TrainingWeightWrapperTensor:
        wrapped = tensor.as_subclass(cls)
        wrapped.config = config
        return wrapped

    def __init__(self, tensor: torch.Tensor, config: MXFP8TrainingOpConfig) -> None:
        pass

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in ("linear", "mm", "matmul", "addmm"):
            a, b = args[0], args[1]
            assert not isinstance(a, cls), f"A should not be a {cls.__name__}"
            assert isinstance(b, cls), f"B should be a {cls.__name__}"
            return mx_mm.apply(a, b, b.config)  # the bias (args[2]) is dropped, as by torchao 0.18
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if func is torch.Tensor.detach:  # as torchao's __torch_dispatch__: a detached parameter stays wrapped
            return cls(out, args[0].config)
        return out


def _swap_params(module: torch.nn.Module, config: MXFP8TrainingOpConfig) -> torch.nn.Module:
    for mod in module.modules():
        for name, param in list(mod.named_parameters(recurse=False)):
            if not isinstance(param.data, MXFP8TrainingWeightWrapperTensor):
                wrapped = MXFP8TrainingWeightWrapperTensor(param.data, config)
                setattr(mod, name, torch.nn.Parameter(wrapped, requires_grad=param.requires_grad))
    return module


def _is_linear(mod: torch.nn.Module, *args: Any) -> bool:
    return isinstance(mod, torch.nn.Linear) and hasattr(mod, "weight")


def quantize_(
    model: torch.nn.Module,
    config: MXFP8TrainingOpConfig,
    filter_fn: Callable[[torch.nn.Module, str], bool] | None = _is_linear,
    device: Any = None,
) -> None:
    if not isinstance(config, MXFP8TrainingOpConfig):
        raise AssertionError(
            f"the stand-in quantizes with MXFP8TrainingOpConfig only, not {type(config).__name__}"
        )
    accept = _is_linear if filter_fn is None else filter_fn

    def visit(module: torch.nn.Module, fqn: str) -> torch.nn.Module:
        if accept(module, fqn):
            return _swap_params(module, config)
        for name, child in list(module.named_children()):
            new = visit(child, f"{fqn}.{name}" if fqn else name)
            if new is not child:
                setattr(module, name, new)
        return module

    visit(model, "")


MX_MODULES = (
    "torchao.quantization",
    "torchao.prototype",
    "torchao.prototype.moe_training",
    "torchao.prototype.moe_training.config",
    "torchao.prototype.moe_training.tensor",
    "torchao.prototype.mx_formats",
)


def install(monkeypatch: Any) -> types.ModuleType:
    """Install the stand-in as ``torchao``, ``torchao.float8`` and ``torchao.float8.config`` for one test (pytest's
    ``monkeypatch``). The FP8 dtype pair is chosen now, from the torch in place (a ROCm stand-in installed first
    makes it the FNUZ pair on an MI300), as torchao chooses it on import."""
    e4m3, e5m2 = _type_pair()
    monkeypatch.setitem(globals(), "e4m3_dtype", e4m3)
    monkeypatch.setitem(globals(), "e5m2_dtype", e5m2)
    package = types.ModuleType("torchao")
    float8 = types.ModuleType("torchao.float8")
    config = types.ModuleType("torchao.float8.config")
    for name in ("CastConfig", "Float8LinearConfig", "Float8LinearRecipeName", "convert_to_float8_training"):
        setattr(float8, name, globals()[name])
    for name in ("CastConfig", "Float8LinearConfig", "Float8LinearRecipeName", "e4m3_dtype", "e5m2_dtype"):
        setattr(config, name, globals()[name])
    package.float8 = float8  # type: ignore[attr-defined]
    float8.config = config  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchao", package)
    monkeypatch.setitem(sys.modules, "torchao.float8", float8)
    monkeypatch.setitem(sys.modules, "torchao.float8.config", config)
    modules = {name: types.ModuleType(name) for name in MX_MODULES}
    modules["torchao.quantization"].quantize_ = quantize_  # type: ignore[attr-defined]
    for name in ("KernelPreference", "MXFP8TrainingOpConfig", "MXFP8TrainingRecipe", "ScaleCalculationMode"):
        setattr(modules["torchao.prototype.moe_training.config"], name, globals()[name])
    modules["torchao.prototype.moe_training.tensor"].MXFP8TrainingWeightWrapperTensor = (  # type: ignore[attr-defined]
        MXFP8TrainingWeightWrapperTensor
    )
    modules["torchao.prototype.mx_formats"].ScaleCalculationMode = ScaleCalculationMode  # type: ignore[attr-defined]
    for name, module in modules.items():
        parent, _, child = name.rpartition(".")
        setattr(modules.get(parent, package), child, module)
        monkeypatch.setitem(sys.modules, name, module)
    return float8


def remove(monkeypatch: Any) -> None:
    """Make ``import torchao`` fail for one test, as on a host without it."""
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    monkeypatch.setitem(sys.modules, "torchao.float8.config", None)
    for name in MX_MODULES:
        monkeypatch.setitem(sys.modules, name, None)
