# Shared by the deploy/mpi examples (source it after setting ARGS): runs `sdtrain "${ARGS[@]}"` on every rank with
# MPICH / Intel MPI's Hydra (the seed's form) or Open MPI. The first argument of the example picks the launcher.
HOSTS=${HOSTS:-$HOME/hosts}
SDTRAIN=${SDTRAIN:-sdtrain}
MASTER_ADDR=${MASTER_ADDR:-$(grep -v '^#' "$HOSTS" | head -1)}   # rank 0's host: the first line of the hostfile
RANKS=${RANKS:-3}
PER_NODE=${PER_NODE:-1}
case "${1:-hydra}" in
  hydra)   # MPICH / Intel MPI: the seed's form
    exec ${MPIRUN:-mpirun} -f "$HOSTS" -n "$RANKS" -ppn "$PER_NODE" ${IFACE:+-iface "$IFACE"} -genv MASTER_ADDR "$MASTER_ADDR" ${MASTER_PORT:+-genv MASTER_PORT "$MASTER_PORT"} "$SDTRAIN" "${ARGS[@]}" ;;
  openmpi)
    exec ${MPIRUN:-mpirun} --hostfile "$HOSTS" -n "$RANKS" --map-by ppr:"$PER_NODE":node -x MASTER_ADDR="$MASTER_ADDR" ${MASTER_PORT:+-x MASTER_PORT="$MASTER_PORT"} "$SDTRAIN" "${ARGS[@]}" ;;
  *) echo "usage: $0 [hydra|openmpi]" >&2; exit 2 ;;
esac
