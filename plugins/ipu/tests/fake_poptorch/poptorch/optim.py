"""Stand-in ``poptorch.optim``: AdamW with PopTorch's extra arguments, checked as PopTorch checks them
(accumulation types must be float16 or float32), stepping on the CPU. As on the IPU, the moments are kept in
their accumulation type, so fp16 weights train with fp32 moments when asked."""

from __future__ import annotations

from typing import Any

import torch

_ACCUM_TYPES = (torch.float16, torch.float32)


def _check_accum(**types: torch.dtype | None) -> None:
    for name, dtype in types.items():
        if dtype is not None and dtype not in _ACCUM_TYPES:
            raise ValueError(f"{name} must be either torch.float32 or torch.float16, got {dtype}")


class AdamW(torch.optim.AdamW):
    """poptorch.optim.AdamW(params, lr, betas, eps, weight_decay, amsgrad, loss_scaling, accum_type,
    first_order_momentum_accum_type, second_order_momentum_accum_type, max_grad_norm)."""

    def __init__(
        self,
        params: Any,
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        amsgrad: bool | None = None,
        loss_scaling: float | None = None,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        _check_accum(
            accum_type=accum_type,
            first_order_momentum_accum_type=first_order_momentum_accum_type,
            second_order_momentum_accum_type=second_order_momentum_accum_type,
        )
        if amsgrad:
            raise ValueError("Only non-amsgrad AdamW is supported on the IPU")
        super().__init__(
            params,
            lr=1e-3 if lr is None else lr,
            betas=(0.9, 0.999) if betas is None else betas,
            eps=1e-8 if eps is None else eps,
            weight_decay=1e-2 if weight_decay is None else weight_decay,
            foreach=False,
        )
        self.loss_scaling = 1.0 if loss_scaling is None else float(loss_scaling)
        self.max_grad_norm = float("inf") if max_grad_norm is None else float(max_grad_norm)
        self.accum_types = (accum_type, first_order_momentum_accum_type, second_order_momentum_accum_type)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Decoupled-weight-decay Adam, computed in fp32 where the moments are fp32."""
        for group in self.param_groups:
            lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                moment_type = self.accum_types[1] or p.dtype
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=moment_type)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=self.accum_types[2] or p.dtype)
                state["step"] += 1
                work = state["exp_avg"].dtype
                grad = p.grad.to(work)
                weight = p.to(work).mul_(1 - lr * decay)
                state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                corrected1 = 1 - beta1 ** state["step"]
                corrected2 = 1 - beta2 ** state["step"]
                denom = (state["exp_avg_sq"].to(work) / corrected2).sqrt_().add_(eps)
                weight.addcdiv_(state["exp_avg"] / corrected1, denom, value=-lr)
                p.copy_(weight)
        return None


class SGD(torch.optim.SGD):
    """poptorch.optim.SGD(params, lr, momentum, dampening, weight_decay, nesterov, loss_scaling, velocity_scaling,
    use_combined_accum, accum_type, velocity_accum_type, max_grad_norm): torch's SGD stepping on the CPU."""

    def __init__(
        self,
        params: Any,
        lr: float | None = None,
        momentum: float | None = None,
        dampening: float | None = None,
        weight_decay: float | None = None,
        nesterov: bool | None = None,
        loss_scaling: float | None = None,
        velocity_scaling: float | None = None,
        use_combined_accum: bool | None = None,
        accum_type: torch.dtype | None = None,
        velocity_accum_type: torch.dtype | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        _check_accum(accum_type=accum_type, velocity_accum_type=velocity_accum_type)
        super().__init__(
            params,
            lr=0.01 if lr is None else lr,
            momentum=momentum or 0.0,
            dampening=dampening or 0.0,
            weight_decay=weight_decay or 0.0,
            nesterov=bool(nesterov),
            foreach=False,
        )
        self.loss_scaling = 1.0 if loss_scaling is None else float(loss_scaling)
        self.max_grad_norm = float("inf") if max_grad_norm is None else float(max_grad_norm)
        self.accum_types = (accum_type, velocity_accum_type)


class RMSprop(torch.optim.RMSprop):
    """poptorch.optim.RMSprop(params, lr, alpha, eps, weight_decay, momentum, centered, loss_scaling, accum_type,
    first_order_momentum_accum_type, second_order_momentum_accum_type, use_tf_variant, max_grad_norm)."""

    def __init__(
        self,
        params: Any,
        lr: float | None = None,
        alpha: float | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        momentum: float | None = None,
        centered: bool | None = None,
        loss_scaling: float | None = None,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
        use_tf_variant: bool | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        _check_accum(
            accum_type=accum_type,
            first_order_momentum_accum_type=first_order_momentum_accum_type,
            second_order_momentum_accum_type=second_order_momentum_accum_type,
        )
        super().__init__(
            params,
            lr=0.01 if lr is None else lr,
            alpha=0.99 if alpha is None else alpha,
            eps=1e-8 if eps is None else eps,
            weight_decay=weight_decay or 0.0,
            momentum=momentum or 0.0,
            centered=bool(centered),
            foreach=False,
        )
        self.loss_scaling = 1.0 if loss_scaling is None else float(loss_scaling)
        self.max_grad_norm = float("inf") if max_grad_norm is None else float(max_grad_norm)
        self.accum_types = (accum_type, first_order_momentum_accum_type, second_order_momentum_accum_type)
