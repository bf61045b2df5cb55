#!/usr/bin/env bash
# The seed deployment's command (Intel's cloud module for Xeon) with `accelerate launch textual_inversion.py`
# replaced by `sdtrain textual-inversion`: 3 machines, one rank each.
#   HOSTS=~/hosts MODEL=/shared/sd-1.5 DATA=/shared/dicoo OUT=/shared/out deploy/mpi/textual-inversion.sh [hydra|openmpi]
# Every machine needs sdtrain at the same path and the model, data and output folders at the same paths (a shared
# file system, or copies; rank 0 writes outputs and checkpoints, and every rank reads checkpoints on resume).
set -euo pipefail
HOSTS=${HOSTS:-$HOME/hosts}
MODEL=${MODEL:?path of the pipeline (diffusers layout)}
DATA=${DATA:?folder of training images}
OUT=${OUT:-textual_inversion_output}
SDTRAIN=${SDTRAIN:-sdtrain}
MASTER_ADDR=${MASTER_ADDR:-$(grep -v '^#' "$HOSTS" | head -1)}   # rank 0's host: the first line of the hostfile
IFACE=${IFACE:-}                                                 # e.g. eth1: the network the ranks share
RANKS=${RANKS:-3}
PER_NODE=${PER_NODE:-1}

ARGS=(textual-inversion --pretrained_model_name_or_path="$MODEL" --train_data_dir="$DATA"
  --learnable_property=object --placeholder_token="<dicoo>" --initializer_token=toy --resolution=512
  --train_batch_size=1 --seed=7 --gradient_accumulation_steps=1 --max_train_steps=30 --learning_rate=2.0e-03
  --scale_lr --lr_scheduler=constant --lr_warmup_steps=0 --output_dir="$OUT" --mixed_precision=bf16
  --save_as_full_pipeline ${IFACE:+--dist_iface=$IFACE} ${EXTRA_ARGS:-})   # a flag repeated in EXTRA_ARGS wins

case "${1:-hydra}" in
  hydra)   # MPICH / Intel MPI: the seed's form
    exec ${MPIRUN:-mpirun} -f "$HOSTS" -n "$RANKS" -ppn "$PER_NODE" ${IFACE:+-iface "$IFACE"} -genv MASTER_ADDR "$MASTER_ADDR" ${MASTER_PORT:+-genv MASTER_PORT "$MASTER_PORT"} "$SDTRAIN" "${ARGS[@]}" ;;
  openmpi)
    exec ${MPIRUN:-mpirun} --hostfile "$HOSTS" -n "$RANKS" --map-by ppr:"$PER_NODE":node -x MASTER_ADDR="$MASTER_ADDR" ${MASTER_PORT:+-x MASTER_PORT="$MASTER_PORT"} "$SDTRAIN" "${ARGS[@]}" ;;
  *) echo "usage: $0 [hydra|openmpi]" >&2; exit 2 ;;
esac
