"""accelbench-rocm: the accelbench backend for AMD GPUs through ROCm (HIP).

ROCm builds of torch drive AMD GPUs through the ``cuda`` device type, so this backend's tensors live on
``torch.device("cuda")``; what differs from NVIDIA is detected here: :mod:`~accelbench_rocm.visible` (ROCR/HIP
visible-device variables), :mod:`~accelbench_rocm.smi` (amdsmi: detection, device memory, energy),
:mod:`~accelbench_rocm.probe` (detection in a subprocess without amdsmi), :mod:`~accelbench_rocm.precision`
(precisions by gfx architecture) and :mod:`~accelbench_rocm.peaks` (peaks per GCD).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("accelbench-rocm")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
