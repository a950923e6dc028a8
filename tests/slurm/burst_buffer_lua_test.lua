--[[
slurm/plugin/burst_buffer.lua under a plain Lua (5.1, which Debian 12's Slurm
embeds, and 5.3) with the real granary binary and a real SQLite store: every one of Slurm's eleven functions exists,
each delegates to `granary slurm` with its arguments quoted (a path with a
quote and a space in it), and returns slurm.ERROR with granary's message when
granary fails. The `slurm` table is the small part of Slurm's Lua API the
script uses (return codes and logging); Slurm itself is not started here.

  GRANARY_BIN=build/cli/granary GRANARY_STORE=sqlite:///tmp/x/granary.db \
    lua5.3 tests/slurm/burst_buffer_lua_test.lua slurm/plugin/burst_buffer.lua
--]]

local errors_logged = 0
slurm = {
	SUCCESS = 0,
	ERROR = -1,
	log_error = function() errors_logged = errors_logged + 1 end,
	log_info = function() end,
}

local plugin, work = arg[1], arg[2]
assert(plugin and work, "usage: burst_buffer_lua_test.lua PLUGIN WORK_DIR")
dofile(plugin)

local failures = 0
local function check(cond, what)
	if not cond then
		failures = failures + 1
		io.stderr:write("FAIL: " .. what .. "\n")
	end
end
local function write(path, text)
	local f = assert(io.open(path, "w"))
	f:write(text)
	f:close()
end
-- os.execute's result: an exit status in Lua 5.1, true or nil in 5.2+.
local function run(command)
	local r = os.execute(command)
	return r == true or r == 0
end
local function read(path)
	local f = assert(io.open(path, "r"))
	local text = f:read("*a")
	f:close()
	return text
end

for _, name in ipairs({ "job_process", "pools", "job_teardown", "setup", "data_in", "real_size",
	"paths", "pre_run", "post_run", "data_out", "get_status" }) do
	check(type(_G["slurm_bb_" .. name]) == "function", "slurm_bb_" .. name .. " is defined")
end

-- Scripts and the path file in a directory whose name needs quoting; the
-- source in one without (a directive's values cannot hold spaces).
local dir = work .. "/it's a dir"
local source = work .. "/src"
assert(run("mkdir -p \"" .. dir .. "\" \"" .. source .. "/cats\""))
write(source .. "/cats/1.jpg", "meow")

local bad = dir .. "/bad.sh"
write(bad, "#!/bin/bash\n#DW jobdw capacity=1GiB\n#DW stage_out type=directory\n")
local rc, msg = slurm_bb_job_process(bad, "1000", "1000", {})
check(rc == slurm.ERROR, "a bad script is rejected")
check(msg:find("line 3: #DW stage_out is not supported", 1, true), "the reason: " .. msg)
check(errors_logged == 1, "the failure is logged")

-- A persistentdw job over a dataset made beforehand: a jobdw needs a pool
-- with a live cache node, which this test does not start (the C++ tests
-- cover stage_in's steps against the store).
local granary_bin = os.getenv("GRANARY_BIN")
local store = os.getenv("GRANARY_STORE")
assert(run("'" .. granary_bin .. "' --store '" .. store .. "' dataset create pets --source " ..
	source .. " > /dev/null"))
local good = dir .. "/good.sh"
write(good, "#!/bin/bash\n#DW persistentdw name=pets\nsrun true\n")
rc, msg = slurm_bb_job_process(good)
check(rc == slurm.SUCCESS, "a good script is accepted: " .. tostring(msg))
check(msg:find("line 2: persistentdw pets", 1, true), "validate says " .. msg)
-- 23.02+ passes the submitting user: another user's dataset is refused at
-- submission, with the fix.
local me, my_group = io.popen("id -u"):read("*l"), io.popen("id -g"):read("*l")
rc, msg = slurm_bb_job_process(good, me, my_group, {})
check(rc == slurm.SUCCESS, "the owner's own dataset: " .. tostring(msg))
if me ~= "65534" then
	rc, msg = slurm_bb_job_process(good, "65534", "65534", {})
	check(rc == slurm.ERROR, "another user's dataset is refused")
	check(msg:find("may not read dataset 'pets'", 1, true), "the reason: " .. msg)
	check(msg:find("granary dataset grant pets", 1, true), "the fix: " .. msg)
	errors_logged = errors_logged - 1
end

rc, msg = slurm_bb_pools()
check(rc == slurm.SUCCESS and msg:find('{"pools":[]}', 1, true), "pools without nodes: " .. msg)

local uid, gid = io.popen("id -u"):read("*l"), io.popen("id -g"):read("*l")
rc, msg = slurm_bb_setup("77", uid, gid, "default", "1073741824", good, {})
check(rc == slurm.SUCCESS, "setup: " .. tostring(msg))
rc, msg = slurm_bb_data_in("77", good)
check(rc == slurm.SUCCESS, "data_in: " .. tostring(msg))
check(slurm_bb_real_size("77") == slurm.SUCCESS, "real_size")

local path_file = dir .. "/path file"
write(path_file, "")
rc, msg = slurm_bb_paths("77", good, path_file, uid, gid, {})
check(rc == slurm.SUCCESS, "paths: " .. tostring(msg))
local env = read(path_file)
check(env:find("GRANARY_SOCKET=/run/granary/slurm/job-77.sock\n", 1, true), "paths wrote " .. env)
check(env:find("GRANARY_DATASET=pets\n", 1, true), "paths wrote " .. env)

check(slurm_bb_pre_run("77", good) == slurm.SUCCESS, "pre_run")
check(slurm_bb_post_run("77", good) == slurm.SUCCESS, "post_run")
check(slurm_bb_data_out("77", good) == slurm.SUCCESS, "data_out")
rc, msg = slurm_bb_get_status("0", "0")
check(rc == slurm.SUCCESS and msg:find("pets", 1, true), "get_status: " .. msg)

rc, msg = slurm_bb_job_teardown("77", good, "false")
check(rc == slurm.SUCCESS and msg:find("0 job-scoped datasets deleted", 1, true), "teardown: " .. msg)
rc, msg = slurm_bb_job_teardown("77", good, "true", uid, gid)
check(rc == slurm.SUCCESS and msg:find("0 job-scoped datasets deleted", 1, true),
	"teardown again: " .. msg)
check(run("'" .. granary_bin .. "' --store '" .. store .. "' dataset show pets > /dev/null"),
	"the persistent dataset stays")
rc, msg = slurm_bb_job_teardown("x7", good, "false")
check(rc == slurm.ERROR and msg:find("Slurm job id 'x7'", 1, true), "a bad job id: " .. msg)

os.execute("rm -rf \"" .. dir .. "\" \"" .. source .. "\"")
if failures > 0 then
	io.stderr:write(failures .. " failures\n")
	os.exit(1)
end
print("burst_buffer.lua: all checks passed")
