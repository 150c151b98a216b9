"""accelbench-xpu: the accelbench backend for Intel GPUs (Data Center GPU Max, Arc) through torch's XPU device.

The entry point is :mod:`accelbench_xpu.plugin`. :mod:`~accelbench_xpu.paths` decides between the modern path
(stock ``torch.xpu``, collective ``xccl``) and the legacy one (Intel Extension for PyTorch, oneCCL bindings,
collective ``ccl``); :mod:`~accelbench_xpu.level_zero` handles what one device is (card or tile,
ZE_FLAT_DEVICE_HIERARCHY) and pins each local rank with ZE_AFFINITY_MASK; :mod:`~accelbench_xpu.probe` detects
in a subprocess; :mod:`~accelbench_xpu.peaks` holds the peak table.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("accelbench-xpu")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
