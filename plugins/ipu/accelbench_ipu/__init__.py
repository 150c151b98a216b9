"""accelbench-ipu: the Graphcore IPU backend of accelbench (PopTorch, from the Poplar SDK).

Pipelined, sharded, serial-phased and parallel-phased execution of the GPT reference workload over IPUs,
with replication, device iterations and gradient accumulation; compile time measured apart, cold and cached.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("accelbench-ipu")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
