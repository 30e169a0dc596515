#!/usr/bin/env bash
# Ground truth on a GPU (issue 13, docs/profile.md "What was measured on a GPU"): zrt calibrate,
# then zrt measure + zrt diff (against the calibrated pack and against the shipped pack of the
# same GPU) for training, prefill and decode steps of bundled models cut to a few layers, then
# zrt profile of their kernels into a measured table, and one diff priced from that table.
#
#   bash benchmarks/gpu_ground_truth.sh OUTDIR [DEVICE]
#
# DEVICE is cuda (default) or cpu (a dry run of the same chain at tiny sizes). Every step has
# its own time limit and writes OUTDIR/<step>.json|.log; a step that fails is logged and the
# next runs, so a cut-short run still leaves what it measured. The result is the directory
# OUTDIR (tar it to carry it off the machine; TAR_TO=FILE.tar.gz re-tars it after each step).
# Every measurement runs before any profile, so a run cut short keeps the diffs' inputs.
# CAL_SIZES and PROFILE_FLAGS (say --no-grid) shorten a run that has few device minutes;
# PROFILES=0 skips the profiles (a machine whose table already ships). PIN_CORE (default 3)
# is the core every step of a GPU run is pinned to.
set -u
OUT_DIR=${1:?usage: gpu_ground_truth.sh OUTDIR [cuda|cpu]}
DEV=${2:-cuda}
mkdir -p "$OUT_DIR"
cd "$OUT_DIR" || exit 2
export PYTHONUNBUFFERED=1

step() {  # step NAME LIMIT_S command...: run, keep stdout in NAME.json|.out and stderr in NAME.log
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    # on a GPU every step runs on one core (PIN_CORE): unpinned, an eager decode step's
    # host moved between processes by more than the host model's error (docs/profile.md)
    timeout "$limit" ${PIN[@]+"${PIN[@]}"} "$@" > "$name.out" 2> "$name.log"
    local rc=$?
    echo "$(date -u +%H:%M:%S) $name rc=$rc $((SECONDS - t0))s" | tee -a steps.txt
    [ -s "$name.out" ] && head -c1 "$name.out" | grep -q '{' && mv "$name.out" "$name.json"
    [ -n "${TAR_TO:-}" ] && tar czf "$TAR_TO" -C "$(dirname "$OUT_DIR")" "$(basename "$OUT_DIR")"
    return 0
}

{ date -u; nvidia-smi 2>/dev/null; python3 -c "import torch, transformers, sys; \
print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version()); print('transformers', transformers.__version__)"; } \
    > env.txt 2>&1

PIN=()
if [ "$DEV" = cuda ] && command -v taskset > /dev/null; then PIN=(taskset -c "${PIN_CORE:-3}"); fi
if [ "$DEV" = cuda ]; then
    HW=$(python3 -c "import torch; n = torch.cuda.get_device_name(0); \
print('nvidia_h200' if 'H200' in n else 'nvidia_h100_sxm' if 'H100' in n else 'nvidia_b200')")
    CAL=(--dtypes fp32,tf32,bf16,fp16,fp8 --sizes ${CAL_SIZES:-512,1024,2048,4096,8192} --mem-mb 512
         --repeats 3 --min-time-ms 10)
    DT=bfloat16
    # model, layers kept, train batch x seq; decode batch over a cache of seq
    TRAIN=("llama3.1-8b 4 2 2048" "gpt2 12 8 1024" "qwen3-30b-a3b 2 2 2048")
    PREFILL=("llama3.1-8b 4 1 4096")
    DECODE=("llama3.1-8b 8 16 2048")
    PROFILE=("llama3.1-8b --train --batch 2 --seq-len 2048"
             "llama3.1-8b --infer --batch 16 --seq-len 2048"
             "qwen3-30b-a3b --train --batch 2 --seq-len 2048"
             "gpt2 --train --batch 8 --seq-len 1024")
else
    HW=./cal.yaml
    CAL=(--sizes 64,128,256 --repeats 2 --min-time-ms 2 --id cpu_dry)
    DT=float32
    TINY=$(mktemp -d)
    printf '%s' '{"model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 512}' > "$TINY/config.json"
    TRAIN=("$TINY/config.json 2 2 64")
    PREFILL=("$TINY/config.json 2 1 64")
    DECODE=("$TINY/config.json 2 2 64")
    PROFILE=("$TINY/config.json --train --batch 2 --seq-len 64")
fi

step calibrate 240 zrt calibrate --device "$DEV" "${CAL[@]}" -o cal.yaml --json
# DIFF_ON_DEVICE=0 leaves the diffs (CPU work: a capture each) to be run after, from the
# measurements and cal.yaml that come back, so the device's minutes go to timing only.
DIFFS=${DIFF_ON_DEVICE:-1}
diff_case() {  # NAME: the diffs of m_NAME.json
    local name=$1
    [ "$DIFFS" = 1 ] && [ -f "m_$name.json" ] || return 0
    step "d_${name}_cal" 120 zrt diff "m_$name.json" --hw ./cal.yaml --json
    [ "$DEV" = cuda ] && step "d_${name}_$HW" 120 zrt diff "m_$name.json" --hw "$HW" --json
    return 0
}
run_case() {  # mode "model layers batch seq"
    local mode=$1 model layers batch seq name flags
    read -r model layers batch seq <<< "$2"
    name=$(basename "$model" .json)_$mode
    case $mode in
        train) flags=(--train) ;;
        prefill) flags=(--infer) ;;
        decode) flags=(--infer --decode) ;;
    esac
    step "m_$name" 180 zrt measure "$model" --device "$DEV" "${flags[@]}" --batch "$batch" \
        --seq-len "$seq" --layers "$layers" --dtype "$DT" --repeats 5 --json
    diff_case "$name"
}
profile_case() {  # INDEX "model flags..."
    # shellcheck disable=SC2086
    step "p_$(basename "$(echo "$2" | cut -d' ' -f1)" .json)_$1" 240 zrt profile $2 \
        --device "$DEV" --hw "$HW" --out tables --dtype "$DT" --repeats 5 --min-time-ms 5 \
        ${PROFILE_FLAGS:-} --json
}
for c in "${TRAIN[@]}"; do run_case train "$c"; done
for c in "${DECODE[@]}"; do run_case decode "$c"; done
for c in "${PREFILL[@]}"; do run_case prefill "$c"; done
i=1
[ "${PROFILES:-1}" = 1 ] || PROFILE=()
for c in "${PROFILE[@]}"; do profile_case $i "$c"; i=$((i + 1)); done
first=$(basename "$(echo "${TRAIN[0]}" | cut -d' ' -f1)" .json)_train
[ "$DIFFS" = 1 ] && [ -f "m_$first.json" ] && step "d_${first}_tables" 120 zrt diff \
    "m_$first.json" --hw "$HW" --tables tables --json
echo done | tee -a steps.txt
