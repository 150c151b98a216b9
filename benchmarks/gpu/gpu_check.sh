#!/usr/bin/env bash
# accelbench on a real NVIDIA GPU: every check of benchmarks/gpu/README.md in few, full batches.
#
#   bash benchmarks/gpu/gpu_check.sh OUTDIR SECTION...   SECTION: titan | parity | functional | speed | final |
#                                   prediction | fast-paths | recheck | recheck-extras | plan | titan-compiled | compiled | all
#
# Runs from the repository root on a machine with a CUDA build of torch. Wheels in .whl/ (made by
# benchmarks/gpu/prepare.sh: accelbench, accelbench-cuda, pydantic, DeepSpeed, ...) are installed into a private
# folder first when present; otherwise accelbench must already be installed. Everything it makes (result records,
# sweep logs, cross-check JSON, profiles, logs) goes under OUTDIR/work and is packed into OUTDIR/gpu-check.tgz with
# a summary in OUTDIR/summary.txt. GPU_CHECK_BUDGET_S (default 560) bounds the wall time: a step that would start
# past it is skipped and says so; sweeps interrupted at the budget keep their finished points (re-run to resume).
set -uo pipefail
OUT=${1:?usage: gpu_check.sh OUTDIR SECTION...}
shift
SECTIONS=${*:-all}
BUDGET=${GPU_CHECK_BUDGET_S:-560}
START=$(date +%s)
# GPU_CHECK_WORK: a work folder that outlives the call (on a machine kept warm between calls), so that a second
# call resumes the first's interrupted sweeps and plan instead of starting them again. It must be ignored by the
# repository's own .gitignore (gpuwork/ is): the device tool lays the tree anew on each call and keeps only ignored
# outputs (a folder ignored by .git/info/exclude alone was wiped between two calls on 2026-11-28).
W="${GPU_CHECK_WORK:-$OUT/work}"
mkdir -p "$OUT" "$W/records" "$W/logs"
export PYTHONUNBUFFERED=1
# accelbench's caches (the calibration each run's prediction is timed with, the measured peaks) inside the results,
# so that the prediction can be re-derived and checked afterwards, off the GPU
export ACCELBENCH_CACHE_DIR="$W/cache"

if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
AB=(python3 -m accelbench.cli)

left() { echo $((BUDGET - ($(date +%s) - START))); }
log() { echo "[$(($(date +%s) - START))s] $*" | tee -a "$W/summary.txt"; }
# step NAME MIN_SECONDS_LEFT CMD...: run CMD (output to logs/NAME.log), or skip it when the budget is short
step() {
    local name=$1 need=$2; shift 2
    if [ "$(left)" -lt "$need" ]; then log "SKIPPED $name (needs ${need}s, $(left)s left)"; return 0; fi
    local t0=$(date +%s)
    timeout --signal=INT --kill-after=30 "$(left)" "$@" >"$W/logs/$name.log" 2>&1
    local rc=$?
    log "$name: exit $rc in $(($(date +%s) - t0))s"
    return 0
}
want() { [[ " $SECTIONS " == *" $1 "* || " $SECTIONS " == *" all "* ]]; }

log "sections: $SECTIONS; budget ${BUDGET}s; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
python3 -c 'import torch, accelbench; print("torch", torch.__version__, "cuda", torch.version.cuda, "accelbench", accelbench.__version__)' | tee -a "$W/summary.txt"

if want titan; then
    # issue 23's performance point: a llama3-1b-class model (Llama 3.2 1B's shape, head untied) in BF16, accelbench
    # against torchtitan on this GPU, alternating (needs torchtitan's wheels: TITAN=1 bash benchmarks/gpu/prepare.sh).
    # Eager first (torchtitan's default); both compiled come last (`titan-compiled`), as compiling costs minutes.
    step titan-shape 30 python3 benchmarks/gpu/titan_side_by_side.py shape
    step titan-eager 150 python3 benchmarks/gpu/titan_side_by_side.py run "$W/titan-eager.json" --batch-size 4 \
        --seq-len 2048 --steps 80
fi

if want parity; then
    # issue 26's GPU point: FP8 (both torchao recipes) and bf16-mixed over three seeds against the fp32 reference
    # trajectory shipped for llama-small; PARITY_CAP_S bounds the sweep (its finished points stay)
    step parity 60 timeout --signal=INT "${PARITY_CAP_S:-240}" "${AB[@]}" sweep benchmarks/gpu/cuda-parity.toml \
        --output-dir "$W/records/parity" --quiet
    step parity-compare 10 "${AB[@]}" compare "$W/records/parity" --vs precision
    cp "$W/logs/parity-compare.log" "$W/parity-compare.txt" 2>/dev/null
fi

if want functional; then
    step plugins 20 "${AB[@]}" plugins
    step plugins-json 20 "${AB[@]}" plugins --json
    step info 20 "${AB[@]}" info
    step info-json 20 "${AB[@]}" info --json
    step detect 20 python3 benchmarks/gpu/crosscheck.py detect "$W/detect.json"
    step ceilings 30 python3 benchmarks/gpu/crosscheck.py ceilings "$W/ceilings.json"
    step crosscheck-runs 90 python3 benchmarks/gpu/crosscheck.py runs "$W/crosscheck.json" "$W/records/crosscheck" \
        --ceilings "$W/ceilings.json"
    step crosscheck-oom 45 python3 benchmarks/gpu/crosscheck.py oom "$W/oom.json" "$W/records/oom-in-process"
    step matrix-eager 120 "${AB[@]}" sweep benchmarks/gpu/cuda-matrix.toml --set compile=false \
        --output-dir "$W/records/matrix" --quiet
    step strategies 60 "${AB[@]}" sweep benchmarks/gpu/cuda-strategies.toml --output-dir "$W/records/strategies" --quiet
    step oom-sweep 40 "${AB[@]}" sweep benchmarks/gpu/cuda-oom.toml --output-dir "$W/records/oom-sweep" --quiet
    step cli-run-json 30 "${AB[@]}" run --backend cuda --model gpt-mini --precision bf16-mixed --epochs 2 \
        --steps-per-epoch 10 --output-dir "$W/records/cli" --json
fi

if want speed; then
    SPEED=(--backend cuda --model gpt2 --output-dir "$W/records/speed" --quiet)
    # 1. the reference: the seed study's harness (minGPT + Lightning) in bf16-mixed, full epochs as the study ran
    step harness-lightning 80 python3 benchmarks/seed_harness.py --model gpt2 --batch-size 64 --precision bf16-mixed \
        --epochs 2 --out "$W/harness-lightning-bf16.json"
    # 2. accelbench's default loop on the same model, data and batch, full epochs, compiled with CUDA graphs
    step ab-b64-compiled-cudagraphs 70 "${AB[@]}" run "${SPEED[@]}" --batch-size 64 --precision bf16-mixed --epochs 3 \
        --compile --compile-mode reduce-overhead
    # 3. MFU at large batches, compiled, and where the time goes
    step mfu-bf16-true-b512 50 "${AB[@]}" run "${SPEED[@]}" --batch-size 512 --precision bf16-true --epochs 3 \
        --steps-per-epoch 40 --compile
    step profile-b512 40 python3 benchmarks/profile_step.py --model gpt2 --batch-size 512 --precision bf16-true \
        --compile --matmul-ceiling 7.805e14 --out "$W/profile-gpt2-b512-bf16-true.json"
    step mfu-bf16-true-b512-dropout0 50 "${AB[@]}" run "${SPEED[@]}" --batch-size 512 --precision bf16-true \
        --dropout 0 --epochs 3 --steps-per-epoch 40 --compile
    step mfu-bf16-true-b1024 50 "${AB[@]}" run "${SPEED[@]}" --batch-size 1024 --precision bf16-true --epochs 3 \
        --steps-per-epoch 30 --compile
    # 4. the ladder from the reference to the tuned loop, one change at a time (batch 64, 200-step epochs)
    step ladder-plain-mingpt 30 python3 benchmarks/seed_harness.py --engine plain --model gpt2 --batch-size 64 \
        --precision bf16-mixed --epochs 3 --steps-per-epoch 200 --out "$W/ladder-plain-mingpt.json"
    LADDER=(--backend cuda --model gpt2 --batch-size 64 --precision bf16-mixed --epochs 3 --steps-per-epoch 200
            --output-dir "$W/records/ladder" --quiet)
    step ladder-eager-host-nopad 20 "${AB[@]}" run "${LADDER[@]}" --data-placement host --vocab-multiple 1
    step ladder-eager-host 20 "${AB[@]}" run "${LADDER[@]}" --data-placement host
    step ladder-eager-device 20 "${AB[@]}" run "${LADDER[@]}"
    step ladder-compiled 45 "${AB[@]}" run "${LADDER[@]}" --compile
    step ladder-compiled-cudagraphs 45 "${AB[@]}" run "${LADDER[@]}" --compile --compile-mode reduce-overhead
    step mfu-bf16-mixed-b512 50 "${AB[@]}" run "${SPEED[@]}" --batch-size 512 --precision bf16-mixed --epochs 3 \
        --steps-per-epoch 40 --compile
    step profile-b64-eager 20 python3 benchmarks/profile_step.py --model gpt2 --batch-size 64 --precision bf16-mixed \
        --out "$W/profile-gpt2-b64-eager.json"
fi

if want final; then
    # what the first two batches left open: the CUDA-initialising query, memory after an out-of-memory, the
    # remaining strategies, --json, and the best MFU setting with CUDA graphs and its profile
    step cuda-init-probe 20 python3 benchmarks/gpu/cuda_init_probe.py
    step oom-sweep 40 "${AB[@]}" sweep benchmarks/gpu/cuda-oom.toml --output-dir "$W/records/oom-sweep" --quiet
    step crosscheck-oom 40 python3 benchmarks/gpu/crosscheck.py oom "$W/oom.json" "$W/records/oom-in-process"
    for s in deepspeed-zero2 deepspeed-zero3; do
        step strategy-$s 20 "${AB[@]}" run --backend cuda --model gpt2 --precision bf16-mixed --batch-size 64 \
            --epochs 3 --steps-per-epoch 30 --devices 1 --strategy $s --output-dir "$W/records/strategies" --quiet
    done
    for s in single ddp; do
        step lightning-$s 20 "${AB[@]}" run --backend cuda --model gpt2 --precision bf16-mixed --batch-size 64 \
            --epochs 3 --steps-per-epoch 30 --devices 1 --engine lightning --strategy $s \
            --output-dir "$W/records/strategies" --quiet
    done
    step cli-run-json 20 "${AB[@]}" run --backend cuda --model gpt-mini --precision bf16-mixed --epochs 2 \
        --steps-per-epoch 10 --output-dir "$W/records/cli" --json
    step mfu-bf16-true-b512-dropout0-cudagraphs 50 "${AB[@]}" run --backend cuda --model gpt2 --batch-size 512 \
        --precision bf16-true --dropout 0 --epochs 3 --steps-per-epoch 40 --compile --compile-mode reduce-overhead \
        --output-dir "$W/records/speed" --quiet
    step profile-b512-dropout0 40 python3 benchmarks/profile_step.py --model gpt2 --batch-size 512 \
        --precision bf16-true --dropout 0 --compile --matmul-ceiling 7.805e14 --out "$W/profile-gpt2-b512-dropout0.json"
fi

if want prediction; then
    # everything added since the H200 run, first part (issue 19 points 1-3): every record's own prediction against
    # the GPU over a batch ladder, the fit check against a real out-of-memory boundary, a profile read by HTA beside
    # accelbench's own breakdown, and the runner against a hand-written loop per workload
    step info-json 20 "${AB[@]}" info --json
    step ceilings 30 python3 benchmarks/gpu/crosscheck.py ceilings "$W/ceilings.json"
    step predict-ladder 120 "${AB[@]}" sweep benchmarks/gpu/cuda-predict.toml --output-dir "$W/records/predict" --quiet
    step fit-boundary 45 "${AB[@]}" sweep benchmarks/gpu/cuda-fit.toml --output-dir "$W/records/fit" --quiet
    for b in 256 320 352; do
        step fit-trace-$b 15 "${AB[@]}" estimate --backend cuda --model gpt2-large --precision bf16-mixed --batch-size $b \
            --trace --json
        cp "$W/logs/fit-trace-$b.log" "$W/fit-trace-$b.json" 2>/dev/null
    done
    step profile-hta 30 "${AB[@]}" run --backend cuda --model gpt2 --precision bf16-mixed --batch-size 64 --epochs 2 \
        --steps-per-epoch 10 --profile --profile-steps 3 --idle-baseline-s 0 --output-dir "$W/records/profile"
    step hand-loop 50 python3 benchmarks/gpu/hand_loop.py "$W/hand-loop.json" gpt:gpt2:bf16-mixed:64:30 \
        bert:bert-base:bf16-mixed:64:20:synthetic=device resnet50:resnet50:bf16-mixed:128:15:synthetic=device
fi

if want fast-paths; then
    # second part (issue 19 point 4, issue 23/26's GPU points): MFU of a gpt2-class model compiled in bf16, FP8
    # (torchao's tensorwise recipe) against bf16 at a width where it should pay, and the llama and moe workloads
    FAST=(--backend cuda --epochs 3 --idle-baseline-s 0 --output-dir "$W/records/fast" --quiet)
    step mfu-gpt2-large-bf16-true 60 "${AB[@]}" run "${FAST[@]}" --model gpt2-large --precision bf16-true \
        --dropout 0 --batch-size 64 --steps-per-epoch 20 --compile
    WIDE=(--workload llama --model custom --layers 4 --embd 4096 --heads 32 --kv-heads 8 --ffn-dim 14336
          --seq-len 2048 --batch-size 4 --steps-per-epoch 15 --compile)
    step llama-wide-bf16-mixed 50 "${AB[@]}" run "${FAST[@]}" "${WIDE[@]}" --precision bf16-mixed
    step llama-wide-fp8-tensorwise 50 "${AB[@]}" run "${FAST[@]}" "${WIDE[@]}" --precision fp8-tensorwise
    step llama-small-eager 20 "${AB[@]}" run "${FAST[@]}" --workload llama --model llama-small \
        --precision bf16-mixed --batch-size 32 --steps-per-epoch 10
    step moe-mini-eager 20 "${AB[@]}" run "${FAST[@]}" --workload moe --model moe-mini --precision bf16-mixed \
        --batch-size 32 --steps-per-epoch 10
fi

if want recheck; then
    # issue 22's step and memory targets on a GPU: each record's prediction (calibrated on this GPU) against what it
    # measured, over the GPT ladder, BERT and ResNet, then llama and moe (whose step is traced on the CPU when the
    # device cannot trace it)
    step recheck-ladder 120 timeout --signal=INT "${RECHECK_CAP_S:-400}" "${AB[@]}" sweep benchmarks/gpu/cuda-predict.toml --output-dir "$W/records/recheck" \
        --quiet
    step recheck-workloads 40 timeout --signal=INT "${WORKLOADS_CAP_S:-150}" "${AB[@]}" sweep benchmarks/gpu/cuda-workloads.toml --output-dir "$W/records/recheck" \
        --quiet
fi

if want recheck-extras; then
    # the rest of the H100 run's list: the profile's own breakdown beside HTA's, BERT against a hand-written loop,
    # and MFU with max-autotune (the H200 run of 2026-11-28 measured none of them)
    step recheck-profile 30 "${AB[@]}" run --backend cuda --model gpt2 --precision bf16-mixed --batch-size 64 \
        --epochs 2 --steps-per-epoch 10 --profile --profile-steps 3 --idle-baseline-s 0 \
        --output-dir "$W/records/profile"
    step recheck-hand-loop-bert 40 python3 benchmarks/gpu/hand_loop.py "$W/hand-loop-bert.json" \
        bert:bert-base:bf16-mixed:64:20:synthetic=device
    step recheck-mfu-autotune 120 "${AB[@]}" run --backend cuda --epochs 3 --idle-baseline-s 0 --quiet \
        --output-dir "$W/records/fast" --model gpt2-large --precision bf16-true --dropout 0 --batch-size 64 \
        --steps-per-epoch 20 --compile --compile-mode max-autotune-no-cudagraphs
fi

if want plan; then
    # issue 22's plan target on a GPU: 16 single-device configurations of gpt2 (4 precisions x 4 batches) priced
    # from this GPU's calibration, the top 12 run for real, predicted against measured rank (Spearman >= 0.9, the
    # top pick within 5% of the best measured); `plan` prints both rankings and their correlation
    step plan 150 "${AB[@]}" plan --backend cuda --model gpt2 --devices 1 --calibrate \
        --precisions bf16-mixed,bf16-true,fp16-mixed,fp32 --batch-sizes 16,32,64,128 --top 16 \
        --measure 12 --measure-steps 20 --out "$W/records/plan"
fi

if want titan-compiled; then
    step titan-compiled 200 python3 benchmarks/gpu/titan_side_by_side.py run "$W/titan-compiled.json" --batch-size 4 \
        --seq-len 2048 --steps 80 --compile
fi

if want compiled; then
    # Functional coverage of --compile over the whole matrix: one sweep per model, side by side (compiling is CPU
    # work and the machine has 16 cores). Their timings are disturbed by each other: they prove the runs work and
    # are recorded right, they are not measurements (those come from the `speed` section, one run at a time).
    if [ "$(left)" -gt 90 ]; then
        pids=()
        for model in gpt-nano gpt-mini gpt2 gpt2-medium; do
            TORCHINDUCTOR_COMPILE_THREADS=4 timeout --signal=INT --kill-after=30 "$(( $(left) - 20 ))" \
                "${AB[@]}" sweep benchmarks/gpu/cuda-matrix.toml --set compile=true --set model=$model \
                --output-dir "$W/records/matrix-compiled-concurrent" --quiet >"$W/logs/compiled-$model.log" 2>&1 &
            pids+=($!)
        done
        for pid in "${pids[@]}"; do wait "$pid"; done
        log "compiled matrix (4 concurrent sweeps): done"
    else
        log "SKIPPED compiled matrix ($(left)s left)"
    fi
fi

# a compact digest of every record made, for the call's output
python3 benchmarks/gpu/digest.py "$W" | tee "$W/digest.txt"
tar czf "$OUT/gpu-check.tgz" -C "$W" . && cp "$W/summary.txt" "$OUT/summary.txt"
log "packed $(du -h "$OUT/gpu-check.tgz" | cut -f1) into gpu-check.tgz"
