"""accelbench-cuda: the accelbench backend for NVIDIA GPUs.

The entry point is :mod:`accelbench_cuda.plugin`; the other modules hold what the hooks rely on, each testable
without a GPU: :mod:`~accelbench_cuda.visible` (CUDA_VISIBLE_DEVICES), :mod:`~accelbench_cuda.nvml` (NVML
detection, device memory, telemetry), :mod:`~accelbench_cuda.probe` (detection in a subprocess when NVML is
missing), :mod:`~accelbench_cuda.precision` (precisions by compute capability, the TF32 policy) and
:mod:`~accelbench_cuda.peaks` (dense peak FLOP/s and bandwidth).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("accelbench-cuda")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
