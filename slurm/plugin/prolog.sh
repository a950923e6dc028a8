#!/bin/sh
# Granary's Slurm node Prolog (docs/slurm.md, "The node side").
#
# slurm.conf on every compute node:
#   Prolog=/etc/slurm/granary-prolog.sh      (this file)
#   Epilog=/etc/slurm/granary-epilog.sh      (epilog.sh)
#   PrologFlags=Alloc                        (runs at allocation, before any task)
#
# slurmd runs it as root on every node of a job, with SLURM_JOB_ID,
# SLURM_JOB_UID and SLURM_JOB_GID set and no PATH. For a job with #DW
# directives, `granary slurm prolog` starts the job's sidecar at
# $JOB_ROOT/job-<job>.sock ($GRANARY_SOCKET) with each stage_in dataset
# mounted at $JOB_ROOT/job-<job>/<name> ($DW_JOB_STRIPED/<name>) and returns
# once it is ready. Any other job costs one `scontrol write batch_script` and
# one store lookup. A failure exits non-zero with the reason on stderr (slurmd's
# log) and in the job's AdminComment; Slurm then drains the node and requeues
# the job (held).

# Settings (the same GRANARY, STORE and JOB_ROOT as in burst_buffer.lua).
GRANARY=/usr/bin/granary
SIDECAR=/usr/bin/granary-sidecar
STORE=redis://127.0.0.1:6379/0
JOB_ROOT=/run/granary/slurm
LOG_DIR=/var/log/granary
TIMEOUT=60s
# The node_id of the granary-cachenode on this host, which stages the job's
# datasets once the job starts; empty: Slurm's name of this node
# ($SLURMD_NODENAME), which is right when cache nodes keep their default
# node_id (the host name) and Slurm names nodes by host name.
NODE=
# The cluster key the job's sidecar proves to cache nodes that require it
# (docs/security.md); empty: granary's default, /etc/granary/cluster.key.
CLUSTER_KEY=

PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
# scontrol exits 0 even when there is no script (not a batch job): the file
# tells.
scontrol write batch_script "$SLURM_JOB_ID" "$work/script" >/dev/null 2>&1
if [ -s "$work/script" ]; then
	set -- --script "$work/script"
else
	set --
fi
if [ -n "$CLUSTER_KEY" ]; then
	set -- --cluster-key-file "$CLUSTER_KEY" "$@"
fi
out=$("$GRANARY" --store "$STORE" slurm prolog "$SLURM_JOB_ID" --uid "$SLURM_JOB_UID" \
	--gid "$SLURM_JOB_GID" --job-root "$JOB_ROOT" --sidecar "$SIDECAR" --log-dir "$LOG_DIR" \
	--timeout "$TIMEOUT" --node "${NODE:-${SLURMD_NODENAME:-$(hostname)}}" "$@" 2>&1)
rc=$?
if [ "$rc" -ne 0 ]; then
	# slurmd's log, and the job's AdminComment (scontrol show job) for its user.
	printf 'granary prolog, job %s: %s\n' "$SLURM_JOB_ID" "$out" >&2
	scontrol update JobId="$SLURM_JOB_ID" AdminComment="granary prolog: $(printf '%s' "$out" | head -c 900 | tr '\n' ' ')" >/dev/null 2>&1
fi
exit "$rc"
