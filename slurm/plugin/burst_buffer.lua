--[[
Granary's burst_buffer.lua for Slurm's burst_buffer/lua plugin (docs/slurm.md).

Install it next to slurm.conf as burst_buffer.lua, with
  slurm.conf:          BurstBufferType=burst_buffer/lua
  burst_buffer.conf:   Directive=DW

Every slurm_bb_* function is a thin call of `granary slurm <step> ...`: the
logic (directives, datasets, environment, teardown) is C++ and tested there
(cli/src/slurm_command.cc). Arguments arrive as strings. Slurm 22.05 passes the
arguments named below; 23.02+ appends more (uid, gid, job_info), which are
ignored except by job_process, so one file serves both.

job_process, pools and paths run inside slurmctld holding its locks: the
steps they run read a file and the metadata store, nothing slower.

The job_script Slurm passes is the script as submitted, except that setup
and data_in get /proc/<slurmctld pid>/fd/<n> (its %-symbol-replaced copy of
the merged #DW lines) when a #DW line holds a '%'; it is passed on as it is,
and granary reads each as what it is (docs/slurm.md, "What Slurm passes").
--]]

-- Set by the admin: the granary binary and the metadata store every step
-- uses (the one the cache nodes name in metadata_store).
local GRANARY = os.getenv("GRANARY_BIN") or "/usr/bin/granary"
local STORE = os.getenv("GRANARY_STORE") or "redis://127.0.0.1:6379/0"
-- Where the job's directory ($DW_JOB_STRIPED) and sidecar socket are on the
-- nodes (granary slurm paths --job-root).
local JOB_ROOT = os.getenv("GRANARY_SLURM_JOB_ROOT") or "/run/granary/slurm"
-- The longest data_in waits for one dataset to become usable; keep it below
-- StageInTimeout in burst_buffer.conf.
local DATA_IN_TIMEOUT = "1h"

-- One shell word: single quotes, with ' written as '\''.
local function quote(s)
	return "'" .. string.gsub(tostring(s), "'", "'\\''") .. "'"
end

-- Runs `granary --store STORE <args>`; returns slurm.SUCCESS and its stdout,
-- or slurm.ERROR and what it said (its stderr and stdout), for the user or
-- the job's SystemComment. The exit status is read from a marker line the
-- shell prints, not from pipe:close(), whose results differ between Lua 5.1
-- and 5.2+.
local EXIT_MARKER = "\ngranary-exit-status:"
local function granary(...)
	local words = { quote(GRANARY), "--store", quote(STORE) }
	for _, a in ipairs({ ... }) do
		words[#words + 1] = quote(a)
	end
	local command = table.concat(words, " ")
	local pipe = io.popen(command .. " 2>&1; printf '" .. EXIT_MARKER:gsub("\n", "\\n") ..
		"%d' $?", "r")
	if pipe == nil then
		return slurm.ERROR, "granary: cannot run " .. GRANARY
	end
	local output = pipe:read("*a")
	pipe:close()
	local at = string.find(output, EXIT_MARKER, 1, true)
	local code = at and tonumber(string.sub(output, at + #EXIT_MARKER)) or nil
	if at then
		output = string.sub(output, 1, at - 1)
	end
	if code == 0 then
		return slurm.SUCCESS, output
	end
	slurm.log_error("burst_buffer.lua: %s failed (exit %s): %s", command, tostring(code), output)
	return slurm.ERROR, output
end

-- 23.02+ passes the submitting user: its right to read each persistentdw
-- dataset is checked at sbatch. 22.05 passes the script only; setup checks it
-- then (the job is held with the reason) and the prolog again.
function slurm_bb_job_process(job_script, uid, gid)
	if uid ~= nil and gid ~= nil then
		return granary("slurm", "validate", job_script, "--uid", uid, "--gid", gid)
	end
	return granary("slurm", "validate", job_script)
end

function slurm_bb_pools()
	return granary("slurm", "pools")
end

function slurm_bb_job_teardown(job_id, job_script, hurry)
	return granary("slurm", "teardown", job_id)
end

function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script)
	return granary("slurm", "setup", job_id, uid, gid, job_script)
end

function slurm_bb_data_in(job_id, job_script)
	return granary("slurm", "data_in", job_id, job_script, "--timeout", DATA_IN_TIMEOUT)
end

-- The job's size in its pool stays what it asked for (capacity=).
function slurm_bb_real_size(job_id)
	return slurm.SUCCESS
end

function slurm_bb_paths(job_id, job_script, path_file)
	return granary("slurm", "paths", job_id, job_script, path_file, "--job-root", JOB_ROOT)
end

-- Nothing to do on the controller's side before or after the job's tasks:
-- the node side (a sidecar and the POSIX view on each node) belongs to the
-- nodes' Prolog and Epilog, which are not written yet (docs/slurm.md). Nothing
-- is staged out: #DW stage_out is rejected at submit time.
function slurm_bb_pre_run(job_id, job_script)
	return slurm.SUCCESS
end

function slurm_bb_post_run(job_id, job_script)
	return slurm.SUCCESS
end

function slurm_bb_data_out(job_id, job_script)
	return slurm.SUCCESS
end

-- `scontrol show bbstat`: Granary's cluster status. 22.05 passes only the
-- words after bbstat, 23.02+ the caller's uid and gid first; both are
-- ignored.
function slurm_bb_get_status(...)
	return granary("status")
end
