#!/usr/bin/env bash
# UNet training across machines with sharded optimizer state (FSDP SHARD_GRAD_OP): each rank keeps its share of the
# gradients, float32 master weights, AdamW moments and EMA, so a model too large for one machine's memory with full
# AdamW state trains on several.
#   HOSTS=~/hosts MODEL=/shared/sd-2-base DATA=/shared/laion-subset OUT=/shared/out deploy/mpi/unet-training.sh [hydra|openmpi]
# The output folder must be shared: every rank writes its shard of each checkpoint there.
set -euo pipefail
MODEL=${MODEL:?path of the pipeline (diffusers layout)}
DATA=${DATA:?images with a metadata.jsonl, or with .txt captions}
OUT=${OUT:-unet_training_output}
IFACE=${IFACE:-}

ARGS=(train --pretrained_model_name_or_path="$MODEL" --train_data_dir="$DATA" --resolution=256 --center_crop
  --random_flip --train_batch_size=4 --global_batch_size=96 --learning_rate=1e-4 --adam_weight_decay=0.01
  --lr_scheduler=constant_with_warmup --lr_warmup_steps=1000 --max_grad_norm=1.0 --use_ema --seed=7
  --mixed_precision=bf16 --sharding=shard_grad_op --max_train_steps=20000 --checkpointing_steps=500
  --checkpoints_total_limit=3 --resume_from_checkpoint=latest --output_dir="$OUT" ${IFACE:+--dist_iface=$IFACE}
  ${EXTRA_ARGS:-})   # a flag repeated in EXTRA_ARGS wins
source "$(dirname "$0")/mpirun.sh"
