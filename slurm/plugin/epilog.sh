#!/bin/sh
# Granary's Slurm node Epilog (docs/slurm.md, "The node side"); see prolog.sh
# for the slurm.conf lines. slurmd runs it as root on every node of a job
# after it ends, with SLURM_JOB_ID set. `granary slurm epilog` stops the
# job's sidecar (SIGTERM, SIGKILL after TIMEOUT), unmounts whatever is still
# mounted under $JOB_ROOT/job-<job> (also after a crash) and removes the
# job's directory, socket and state. Nothing of the job's: nothing done.
# Idempotent.

# Settings (as in prolog.sh).
GRANARY=/usr/bin/granary
SIDECAR=/usr/bin/granary-sidecar
STORE=redis://127.0.0.1:6379/0
JOB_ROOT=/run/granary/slurm
LOG_DIR=/var/log/granary
TIMEOUT=60s

PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
out=$("$GRANARY" --store "$STORE" slurm epilog "$SLURM_JOB_ID" --job-root "$JOB_ROOT" \
	--timeout "$TIMEOUT" 2>&1)
rc=$?
if [ "$rc" -ne 0 ]; then
	printf 'granary epilog, job %s: %s\n' "$SLURM_JOB_ID" "$out" >&2
fi
exit "$rc"
