#!/bin/sh
# run_cp.sh MPIEXEC NP PROGRAM [MPI OPTIONS...] [-- PROGRAM ARGS...]
# Runs PROGRAM on NP ranks of this machine (oversubscribed: more ranks than cores is fine) and
# returns its status. Under root, Open MPI needs OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM), which the tests
# set; the MPI OPTIONS (e.g. --mca btl tcp,self, to force the TCP transport used between machines)
# go to mpiexec.
set -u
mpiexec=$1 np=$2 prog=$3
shift 3
mpi_opts=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    mpi_opts="$mpi_opts $1"
    shift
done
[ $# -gt 0 ] && shift
if [ ! -x "$prog" ]; then
    echo "run_cp.sh: $prog is not an executable" >&2
    exit 1
fi
# Open MPI's own launcher options; another MPI would take only -n.
if "$mpiexec" --version 2>/dev/null | grep -q "Open MPI"; then
    # shellcheck disable=SC2086
    exec "$mpiexec" -np "$np" --oversubscribe --bind-to none $mpi_opts "$prog" "$@"
fi
# shellcheck disable=SC2086
exec "$mpiexec" -n "$np" $mpi_opts "$prog" "$@"
