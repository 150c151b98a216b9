"""Which query initialises CUDA? Each runs in a fresh interpreter; prints whether torch.cuda is initialised after."""

import subprocess
import sys

QUERIES = {
    "cudnn.is_available": "torch.backends.cudnn.is_available()",
    "cudnn.version": "torch.backends.cudnn.version()",
    "nccl.version": "torch.cuda.nccl.version()",
    "cuda_plugin.runtime_versions": "__import__('accelbench_cuda.plugin').plugin.accelbench_runtime_versions()",
    "cuda_plugin.detect": "__import__('accelbench_cuda.detect').detect.detect_devices()",
}
for name, expr in QUERIES.items():
    code = f"import torch; value = {expr}; print({name!r}, repr(value)[:80], 'initialised:', torch.cuda.is_initialized())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    print(out.stdout.strip() or out.stderr.strip()[-300:])
