#!/usr/bin/env bash
# One call of the GPU machine that runs several benchmark jobs in order and packs what they
# wrote into one file (the device returns at most 8 files). Each job has its own time limit.
# Usage (repository root): LEVERS_COMMIT=$(git rev-parse HEAD) OUT=dir bash bench/gpu_round.sh JOB ...
# Jobs: gputests capture windowed memvision memsegments peers_llama peers_more ranking trainer ac
#       breakdown breakdown_host calibvision attnfreed newgpu optstate_bf16 optstate_8bit
#       varlen_more zoo_moe_swin moe memmoe auditmoe float8_quality moe_autocast memcompile
#       alignment captests varlen_varied peers_vit peers_vit_more ac_compiled peers_vit_core
#       ac_compiled_05 peers_goal_llama peers_goal_qwen2 ac_flce peers_rb_llama audit_llama
#       gputests_a gputests_b ac_float8
# Liger Kernel is installed from the wheels in .whl/ when that folder is there.
set -u
export PYTHONUNBUFFERED=1 COLUMNS=160
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
R="$OUT/round"
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$R/gpu.txt"
python -c 'import torch; print("torch", torch.__version__)' | tee -a "$R/gpu.txt"
# the copy's .git may not be the measured commit: the caller names it in LEVERS_COMMIT
echo "commit ${LEVERS_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}" | tee -a "$R/gpu.txt"

run() {  # run NAME LIMIT_S COMMAND...: the job's output in $R/NAME.log, its exit code echoed
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$R/$name.log" 2>&1
    local rc=$?
    echo "== $name rc=$rc in $((SECONDS - t0)) s"; tail -n 12 "$R/$name.log"
}

seed() {  # seed NAME FILE...: start $R/NAME from the committed rows, unless this call wrote some
    local name=$1; shift
    mkdir -p "$R/$name"
    [ -f "$R/$name/summary.json" ] || \
        for f in "$@"; do cp "bench/results/$name/$f" "$R/$name/" 2>/dev/null; done
}

goal_rows() {  # goal_rows GROUP: issue 21's goal table's rows of one model, for --only
    local g=$1 v out=""
    for v in compile-layers compile-layers+liger-flce torchtitan-float8 torchtitan-float8+liger-flce \
             levers-stack levers-float8 levers-stack+float8 levers-stack+float8+raise-batch \
             compile-layers+liger-flce@b32 compile-layers+liger-flce@b48 \
             torchtitan-float8+liger-flce@b32 torchtitan-float8+liger-flce@b48; do
        out="$out${out:+,}$g:$v"
    done
    echo "$out"
}

for job in "$@"; do
    case $job in
        gputests) run gputests 480 python -m pytest -q -p no:cacheprovider -rfEs -m gpu tests ;;
        # the same in two halves, for calls of under 10 minutes each
        gputests_a) run gputests_a 420 python -m pytest -q -p no:cacheprovider -rfEs -m gpu \
            tests/ab tests/audit tests/capture tests/workloads ;;
        gputests_b) run gputests_b 480 python -m pytest -q -p no:cacheprovider -rfEs -m gpu \
            tests/levers tests/memory tests/tune tests/zoo ;;
        capture) run capture 300 python bench/capture_overhead.py --out "$R/capture_overhead_h200" --repeats 5 ;;
        # issue 23: what each pass of a two-pass capture saw alone, and the capture's GPU tests
        alignment) run alignment 120 python bench/capture_alignment.py --out "$R/capture_alignment_h200" ;;
        captests) run captests 200 python -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
            tests/capture ;;
        windowed) run windowed 60 python bench/windowed_peak.py --out "$R/windowed_peak_h200" ;;
        memvision) run memvision 170 python bench/memory_accuracy.py --out "$R/memory_vision_h200" \
            --only vit-b16-timm-b64,vit-b16-standin-b64,resnet50-timm-b64,resnet50-standin-b64,vit-b16-timm-b32,vit-b16-timm-b128,resnet50-timm-b32,resnet50-timm-b128 \
            --jobs 3 --deadline-s 150 ;;
        memsegments) run memsegments 170 python bench/memory_accuracy.py --out "$R/memory_segments_h200" \
            --only vit-b16-timm-b64,vit-b16-standin-b64,resnet50-timm-b64,resnet50-standin-b64 \
            --segments --jobs 4 --deadline-s 120 ;;
        peers_llama) run peers_llama 420 python bench/levers_vs_peers.py --only llama \
            --out "$R/levers_vs_peers_h200" --catalogue-out "$R/levers_catalogue_h200" ;;
        peers_more)
            # start from the committed rows unless this call already wrote some (peers_llama)
            seed levers_vs_peers_h200 summary.json
            run peers_more 420 python bench/levers_vs_peers.py --only qwen2,demo \
            --out "$R/levers_vs_peers_h200" --catalogue-out "$R/levers_catalogue_h200" ;;
        # issue 21: timm's ViT-B/16 at batch 64, levers' compile-model (CUDA graphs) and the audit's
        # stack beside per-block compile, whole-model compile and reduce-overhead, in one process
        peers_vit)
            seed levers_vs_peers_h200 summary.json
            run peers_vit 400 python bench/levers_vs_peers.py --only vit \
            --out "$R/levers_vs_peers_h200" --catalogue-out "$R/levers_catalogue_h200" ;;
        # the rows that decide the ViT goal alone (a shorter call): the default, the best peer
        # (reduce-overhead) and levers' compile-model
        peers_vit_core)
            seed levers_vs_peers_h200 summary.json
            run peers_vit_core 300 python bench/levers_vs_peers.py \
            --only vit:default,vit:compile-model-ro,vit:lever:compile-model \
            --out "$R/levers_vs_peers_h200" --catalogue-out "$R/levers_catalogue_h200" ;;
        # the ViT's optional rows (cuDNN attention; max-autotune, minutes of compile) beside their
        # own default and lever row, in a folder of their own: ratios only within one run
        peers_vit_more) run peers_vit_more 560 python bench/levers_vs_peers.py \
            --only vit:lever:compile-model,vit:levers-stack+float8,vit:levers-stack+sdpa-cudnn,vit:levers-stack-max-autotune \
            --out "$R/levers_vs_peers_vit_more_h200" \
            --catalogue-out "$R/levers_catalogue_vit_more_h200" ;;
        ranking) run ranking 240 python bench/audit_ranking.py --out "$R/audit_ranking_h200" ;;
        trainer) mkdir -p "$R/trainer_1b"
            run trainer 240 python -m levers.cli audit --json /tmp/levers_trainer_capture.json \
            --findings-json "$R/trainer_1b/findings.json" --html "$R/trainer_1b/audit.html" \
            --trace /tmp/levers_trainer_trace.json -- python tests/fixtures/scripts/train_trainer.py \
            --size 1b --max-steps 6 --output-dir /tmp/levers_trainer_run ;;
        # the eager rows; ac_compiled adds the compiled ones
        ac) run ac 420 python bench/ac_policies.py --skip-compiled --out "$R/ac_policies_h200" ;;
        breakdown) run breakdown 150 python bench/capture_overhead.py --breakdown --cprofile \
            --out "$R/capture_breakdown_h200" --repeats 5 ;;
        breakdown_host) run breakdown_host 150 python bench/capture_overhead.py --breakdown --cprofile \
            --host-bound --out "$R/capture_breakdown_host_h200" --repeats 7 ;;
        calibvision) run calibvision 200 python bench/memory_accuracy.py --calibrate \
            --out "$R/memory_calibration_vision_h200" --jobs 3 --deadline-s 170 \
            --only vit-b16-timm-b32,vit-b16-timm-b64,vit-b16-timm-b128,resnet50-timm-b32,resnet50-timm-b64,resnet50-timm-b128 ;;
        attnfreed) run attnfreed 240 python bench/attn_freed.py --out "$R/attn_freed_h200" \
            --only qwen2-1b-eager,vit-b16-timm-eager --timeout-s 110 ;;
        # the GPU tests written without a GPU (optimizer state, variable-length data, the zoo's
        # compile levers under inductor)
        newgpu) run newgpu 300 python -m pytest -q -p no:cacheprovider -rfEs -m gpu \
            tests/levers/test_optimizer_state.py tests/levers/test_varlen_gpu.py tests/zoo ;;
        # issue 22: the paired held-out-loss read of each optimizer-state lever (500 steps)
        optstate_bf16) run optstate_bf16 900 python bench/optimizer_state.py \
            --levers adamw-bf16-state --out "$R/optimizer_state_h200/bf16" ;;
        optstate_8bit) run optstate_8bit 900 python bench/optimizer_state.py \
            --levers adamw-8bit --out "$R/optimizer_state_h200/8bit" ;;
        # issue 22: the flex_attention and compiled rows the first varlen call left out
        varlen_more) run varlen_more 420 python bench/varlen.py \
            --variants padded@flex_attention,packing@flex_attention,padding-free@flex_attention,padded+compile@sdpa,pad-to-multiple+compile@sdpa,packing+compile@sdpa \
            --steps 10 --warmup 3 --out "$R/levers_catalogue_varlen_h200" ;;
        # issue 22: pad-to-multiple's measurable case, lengths drawn afresh each step (a new
        # padded width per step); no warm-up, so every compile and recompile is counted and timed
        varlen_varied) run varlen_varied 400 python bench/varlen.py --lengths varied \
            --variants padded+compile@sdpa,pad-to-multiple+compile@sdpa,packing+compile@sdpa,padded@sdpa \
            --steps 30 --warmup 0 --out "$R/levers_catalogue_varlen_varied_h200" ;;
        # issue 20: the mixture of experts and Swin, from the committed zoo rows
        zoo_moe_swin) mkdir -p "$R/zoo_h200" && cp bench/results/zoo_h200/*.json "$R/zoo_h200/"
            run zoo_moe_swin 590 python bench/zoo_tune.py --only mixtral,swin --tune-budget 45 \
            --budget-s 400 --out "$R/zoo_h200" ;;
        # issue 22: the mixture of experts (the zoo's mixtral, ~0.8e9 parameters): the guide's
        # advice and the grouped-GEMM lever timed, its memory predicted, its audit
        moe) run moe 420 python bench/moe.py --out "$R/moe_h200" --budget-s 360 ;;
        # the grouped-mm-autocast lever itself (ef32dbf measured its cast as a bench patch), with
        # compile-blocks and at batch 16, beside the default in one run; then the audit, whose
        # DTYPE002 now names it and measures it on the step
        moe_autocast) run moe_autocast 300 python bench/moe.py --out "$R/moe_autocast_h200" \
            --variants default,lever:grouped-mm-autocast,lever:grouped-mm-autocast+lever:compile-blocks,b=16,b=16+lever:grouped-mm-autocast \
            --catalogue-out "$R/levers_catalogue_moe_autocast_h200" --budget-s 240 ;;
        # issue 21: levers memory's prediction of the compiled step against the H200, eager beside it
        memcompile) mkdir -p "$R/memory_compile_h200"
            run memcompile 300 bash -c "python -m levers.cli memory hf --set arch=llama size=1b batch_size=4 \
                --gpu h200 --no-whatifs --measure --json $R/memory_compile_h200/eager.json && \
                python -m levers.cli memory hf --set arch=llama size=1b batch_size=4 --gpu h200 \
                --no-whatifs --lever compile-blocks --measure --json $R/memory_compile_h200/compiled.json" ;;
        # issue 21: ac-budget's compiled plan against torch's activation_memory_budget (0.3, 0.5,
        # 0.7) at each torch row's measured peak; the compiled rows only, the eager rows kept from
        # the committed summary (or from an ac job earlier in this call)
        ac_compiled)
            seed ac_policies_h200 summary.json meta.json knee.json
            run ac_compiled 500 python bench/ac_policies.py --only-compiled --batches 4 \
                --out "$R/ac_policies_h200" ;;
        # the same at torch's ratio 0.5 only (the 17.8 GiB point; a shorter call)
        ac_compiled_05)
            seed ac_policies_h200 summary.json meta.json knee.json
            run ac_compiled_05 300 python bench/ac_policies.py --only-compiled --batches 4 --ratios 0.5 \
                --out "$R/ac_policies_h200" ;;
        # issue 21: the compiled rows again with the corrected prediction, and with a fused
        # loss: levers' stack (planned for the step with its fused loss) against torch's ratio
        # with Liger's fused loss
        ac_flce)
            seed ac_policies_h200 summary.json meta.json knee.json
            run ac_flce 560 python bench/ac_policies.py --only-compiled --batches 4 --ratios 0.5,0.3 \
                --fused-loss-ratios 0.5,0.8 --out "$R/ac_policies_h200" ;;
        # issue 21: float8 on both sides of the compiled checkpointing rows: levers'
        # compile-blocks,float8,fused-linear-cross-entropy,ac-budget at the peak of torch's ratio
        # 0.5 and at the peak of torchtitan's float8 recipe with that ratio and Liger's loss
        ac_float8) run ac_float8 300 python bench/ac_policies.py --only-compiled --batches 4 \
            --ratios 0.5 --fused-loss-ratios 0.5 --float8-ratios 0.5 \
            --out "$R/ac_policies_float8_h200" ;;
        # issue 21: raise-batch with the prediction of the stack that runs (Liger's loss predicted
        # by its stand-in), beside the best peer at its best batch
        peers_rb_llama) run peers_rb_llama 560 python bench/levers_vs_peers.py \
            --only "llama:default,llama:torchtitan-float8+liger-flce@b48,llama:levers-stack+float8+raise-batch,llama:levers-stack+raise-batch" \
            --max-batch-size 80 --out "$R/levers_vs_peers_rb_h200" \
            --catalogue-out "$R/levers_catalogue_rb_h200" ;;
        # issue 21: the audit of the hf llama 1b on the GPU (DTYPE003 on a real capture)
        audit_llama) mkdir -p "$R/audit_llama_1b_h200"
            run audit_llama 300 python -m levers.cli audit hf --set arch=llama size=1b device=cuda \
            --findings-json "$R/audit_llama_1b_h200/findings.json" \
            --md "$R/audit_llama_1b_h200/audit.md" ;;
        memmoe) run memmoe 200 python bench/memory_accuracy.py --out "$R/memory_moe_h200" \
            --only mixtral-zoo-b4,mixtral-zoo-b16 --jobs 2 --deadline-s 180 ;;
        auditmoe) mkdir -p "$R/moe_audit_h200"
            run auditmoe 300 python -m levers.cli audit zoo --set model=mixtral size=full device=cuda \
            --findings-json "$R/moe_audit_h200/findings.json" --md "$R/moe_audit_h200/audit.md" ;;
        # issue 21: float8's quality read, held-out loss paired over 200 steps per side
        float8_quality) mkdir -p "$R/float8_quality_h200"
            run float8_quality 560 python -m levers.cli ab llama --set size=1b device=cuda \
            --lever float8 --steps 200 --json "$R/float8_quality_h200/ab.json" \
            --md "$R/float8_quality_h200/ab.md" ;;
        # issue 21's goal table: the peers (torchtitan's float8 recipe, per-layer compile, each
        # with Liger's fused linear cross-entropy, at batch 4 and the batches a user would pick)
        # beside levers' float8 stack at batch 4 and with raise-batch, in one process per model
        peers_goal_llama) run peers_goal_llama 720 python bench/levers_vs_peers.py \
            --only "$(goal_rows llama),llama:liger,llama:compile-model,llama:levers-stack+raise-batch,llama:levers-float8+sdpa-cudnn,llama:levers-float8+adamw-bf16-state" \
            --max-batch-size 64 --out "$R/levers_vs_peers_goal_h200" \
            --catalogue-out "$R/levers_catalogue_goal_h200" ;;
        peers_goal_qwen2) run peers_goal_qwen2 600 python bench/levers_vs_peers.py \
            --only "$(goal_rows qwen2)" --max-batch-size 64 --out "$R/levers_vs_peers_goal_h200" \
            --catalogue-out "$R/levers_catalogue_goal_h200" ;;
        *) echo "unknown job $job" ;;
    esac
    # packed after every job (to a temporary name, then moved), so a call cut short keeps the
    # jobs that finished
    tar -czf "$OUT/.round.tgz" -C "$OUT" round && mv "$OUT/.round.tgz" "$OUT/round.tgz"
done
ls -la "$OUT/round.tgz"
