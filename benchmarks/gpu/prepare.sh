#!/usr/bin/env bash
# Here, before a GPU call: wheels for the GPU machine (Python 3.12, x86-64, no package registry) into .whl/:
# accelbench and accelbench-cuda built from this tree, and the packages the machine's image lacks (pydantic and
# its needs, hjson, torchao, Holistic Trace Analysis, and DeepSpeed built without ops; with TITAN=1, torchtitan and its needs). `echo /.whl/ >> .git/info/exclude` keeps them out of git.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
rm -f .whl/accelbench-*.whl .whl/accelbench_cuda-*.whl
python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl . plugins/cuda
get() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$@"
}
ls .whl/pydantic-2*.whl >/dev/null 2>&1 || get pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 \
    typing-inspection==0.4.5 typing_extensions==4.16.0 hjson==3.1.0
# torchao for the FP8 runs (0.17 pairs with the machine's torch 2.11), Holistic Trace Analysis for --profile and the
# two of its needs the image lacks (plotly, pydot)
ls .whl/torchao-*.whl >/dev/null 2>&1 || get torchao==0.17.0
ls .whl/holistictraceanalysis-*.whl >/dev/null 2>&1 || get HolisticTraceAnalysis==0.5.0 plotly==6.5.0 pydot==4.0.1
ls .whl/deepspeed-*.whl >/dev/null 2>&1 || (cd /tmp && DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps \
    --no-build-isolation deepspeed==0.19.8 -w "$OLDPWD/.whl")
# TITAN=1: torchtitan for the side-by-side (benchmarks/gpu/titan_side_by_side.py, gpu_check.sh's `titan` section):
# its 0.2.2 release (the one for the image's torch 2.11) and what it needs that the image lacks, at versions that
# satisfy datasets' pins (dill < 0.4.1, multiprocess < 0.70.19)
if [ "${TITAN:-0}" = 1 ]; then
    ls .whl/torchtitan-*.whl >/dev/null 2>&1 || get torchtitan==0.2.2 torchdata==0.11.0 tyro==1.0.17 \
        docstring-parser==0.18.0 typeguard==4.6.1 datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18
fi
ls -la .whl
