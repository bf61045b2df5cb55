#!/usr/bin/env bash
# The seed deployment's command (Intel's cloud module for Xeon) with `accelerate launch textual_inversion.py`
# replaced by `sdtrain textual-inversion`: 3 machines, one rank each.
#   HOSTS=~/hosts MODEL=/shared/sd-1.5 DATA=/shared/dicoo OUT=/shared/out deploy/mpi/textual-inversion.sh [hydra|openmpi]
# Every machine needs sdtrain at the same path and the model, data and output folders at the same paths (a shared
# file system, or copies; rank 0 writes outputs and checkpoints, and every rank reads checkpoints on resume).
set -euo pipefail
MODEL=${MODEL:?path of the pipeline (diffusers layout)}
DATA=${DATA:?folder of training images}
OUT=${OUT:-textual_inversion_output}
IFACE=${IFACE:-}   # e.g. eth1: the network the ranks share

ARGS=(textual-inversion --pretrained_model_name_or_path="$MODEL" --train_data_dir="$DATA"
  --learnable_property=object --placeholder_token="<dicoo>" --initializer_token=toy --resolution=512
  --train_batch_size=1 --seed=7 --gradient_accumulation_steps=1 --max_train_steps=30 --learning_rate=2.0e-03
  --scale_lr --lr_scheduler=constant --lr_warmup_steps=0 --output_dir="$OUT" --mixed_precision=bf16
  --save_as_full_pipeline ${IFACE:+--dist_iface=$IFACE} ${EXTRA_ARGS:-})   # a flag repeated in EXTRA_ARGS wins
source "$(dirname "$0")/mpirun.sh"
