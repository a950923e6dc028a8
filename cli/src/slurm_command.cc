// `granary slurm <step> ...`: what slurm-plugin/burst_buffer.lua runs for
// Slurm's burst_buffer/lua functions, so that the logic lives here, in
// tested C++, and the Lua stays a thin dispatcher (docs/slurm.md).
//
//   granary slurm validate SCRIPT   slurm_bb_job_process: the script's #DW
//                                   directives, each problem with its line
//
// The other steps (pools, paths, setup, data_in, teardown) are not written
// yet; docs/slurm.md says where they stand.

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "cli_context.h"
#include "granary/core/file.h"
#include "granary/core/names.h"
#include "slurm_directives.h"

namespace granary::cli {
namespace {

Json DirectivesJson(const JobDirectives& d) {
  Json j = Json::object();
  if (d.jobdw) {
    j["jobdw"] = {{"line", d.jobdw->line},
                  {"capacity_bytes", d.jobdw->capacity_bytes},
                  {"pool", d.jobdw->pool}};
  } else {
    j["jobdw"] = nullptr;
  }
  j["stage_in"] = Json::array();
  for (const StageInDirective& s : d.stage_ins) {
    j["stage_in"].push_back({{"line", s.line}, {"source", s.source}, {"name", s.name}});
  }
  j["persistentdw"] = Json::array();
  for (const PersistentDwDirective& p : d.persistent) {
    j["persistentdw"].push_back({{"line", p.line}, {"name", p.name}});
  }
  return j;
}

Status Validate(CliContext& c, const std::string& script_path) {
  Result<std::string> script = ReadFileToString(script_path);
  if (!script.ok()) {
    return Status(script.status().code(), "reading the job script " + Quoted(script_path) + ": " +
                                              script.status().message() +
                                              "; pass the path of a readable file");
  }
  DirectiveParse parse = ParseJobDirectives(*script);
  MetadataStore* store = nullptr;
  if (NeedsStore(parse.directives)) {
    GRANARY_RETURN_IF_ERROR(c.OpenStore());
    store = &c.store();
  }
  GRANARY_RETURN_IF_ERROR(CheckJobDirectives(parse, store));
  if (!parse.errors.empty()) {
    std::string message = "job script " + Quoted(script_path) + ": #DW directives not valid:";
    for (const DirectiveError& e : parse.errors) message += "\n  " + e.ToString();
    return Status::InvalidArgument(std::move(message));
  }
  const JobDirectives& d = parse.directives;
  if (c.json_output()) {
    c.out() << DirectivesJson(d).dump(2) << "\n";
    return Status::Ok();
  }
  if (d.empty()) {
    c.out() << "no #DW directives\n";
    return Status::Ok();
  }
  if (d.jobdw) {
    c.out() << "line " << d.jobdw->line << ": jobdw " << HumanBytes(d.jobdw->capacity_bytes)
            << " in pool " << d.jobdw->pool << "\n";
  }
  for (const StageInDirective& s : d.stage_ins) {
    c.out() << "line " << s.line << ": stage_in " << s.source << " -> $DW_JOB_STRIPED/" << s.name
            << "\n";
  }
  for (const PersistentDwDirective& p : d.persistent) {
    c.out() << "line " << p.line << ": persistentdw " << p.name << "\n";
  }
  return Status::Ok();
}

}  // namespace

void AddSlurmCommand(CLI::App& app, CliContext& context) {
  std::string* script = context.Keep(std::make_unique<std::string>());
  CLI::App* slurm =
      app.add_subcommand("slurm", "Steps of Slurm's burst_buffer/lua plugin (docs/slurm.md)");
  slurm->require_subcommand(1);
  CLI::App* validate = slurm->add_subcommand(
      "validate", "Check a job script's #DW directives (slurm_bb_job_process)");
  validate->add_option("script", *script, "The job script")->required();
  context.OnParsed(validate, [&context, script] { return Validate(context, *script); });
}

}  // namespace granary::cli
