"""Seed 001's speedup from g to n devices ("Speedup formulation"), from a step time and its exposed communication."""

from __future__ import annotations

from accelbench.estimate.schema import ScalingPrediction


def predict_speedup(
    step_s: float, comm_s: float, devices_from: int, devices_to: int, comm_s_to: float
) -> ScalingPrediction:
    """Seed 001's speedup from a measured (or profiled) step at ``devices_from`` = g devices, of which ``comm_s``
    seconds were exposed communication, to ``devices_to`` = n devices whose exposed communication is predicted to
    take ``comm_s_to`` (bytes at n over the bus bandwidth at n).

    ``r_compute = (t_iter - t_comm) / t_iter``, ``r_comm = t_comm / t_iter``, ``eff = t_comm(g) / t_comm(n)``,
    ``speedup = (r_compute + r_comm) / (r_compute + r_comm / eff)``: the step-time ratio with per-device compute
    unchanged. From one device (no communication) it is ``t_iter(1) / (t_iter(1) + t_comm(n))``.
    """
    if step_s <= 0 or comm_s < 0 or comm_s_to < 0 or comm_s > step_s:
        raise ValueError(
            f"step {step_s} s with {comm_s} s of communication: give a positive step time and communication "
            "between 0 and the step time"
        )
    if devices_from < 1 or devices_to < 1:
        raise ValueError(f"device counts must be at least 1 (got {devices_from} -> {devices_to})")
    compute = step_s - comm_s
    step_to = compute + comm_s_to
    efficiency = comm_s / comm_s_to if comm_s > 0 and comm_s_to > 0 else None
    ratio = step_s / step_to
    return ScalingPrediction(
        devices_from=devices_from,
        devices_to=devices_to,
        step_s_from=step_s,
        comm_s_from=comm_s,
        comm_s_to=comm_s_to,
        step_s_to=step_to,
        network_efficiency=efficiency,
        step_ratio=ratio,
        throughput_speedup=devices_to / devices_from * ratio,
    )
