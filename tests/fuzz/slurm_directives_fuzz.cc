// libFuzzer target for the #DW directive parser (slurm/src/directives.cc):
// what slurmctld hands `granary slurm validate` from any user's job script.
// Any crash, sanitizer report or broken invariant is a finding.
//
// Invariants:
//  - errors are in line order, and each names a line that starts with "#DW";
//  - every accepted directive is on such a line, with what the rules promise:
//    a capacity above 0 and a pool that is a DNS label, an absolute source,
//    stage_in names that are DNS labels of at most kMaxStageInNameLength
//    (each once), dataset names that pass ValidateDatasetName;
//  - a stage_in is accepted only with a jobdw line in the script.
// Seeds: tests/fuzz/corpus/slurm_directives (a good script, a bad one).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "granary/slurm/directives.h"

namespace granary::slurm {
namespace {

void Check(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "slurm_directives_fuzz invariant broken: %s\n", what);
  std::abort();
}

std::vector<std::string_view> Lines(std::string_view script) {
  std::vector<std::string_view> lines;
  size_t pos = 0;
  while (pos <= script.size()) {
    size_t end = script.find('\n', pos);
    if (end == std::string_view::npos) end = script.size();
    lines.push_back(script.substr(pos, end - pos));
    pos = end + 1;
  }
  return lines;
}

bool IsDirectiveLine(const std::vector<std::string_view>& lines, int line) {
  return line >= 1 && static_cast<size_t>(line) <= lines.size() &&
         lines[static_cast<size_t>(line) - 1].starts_with("#DW");
}

}  // namespace
}  // namespace granary::slurm

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace granary;
  using namespace granary::slurm;
  std::string_view script(reinterpret_cast<const char*>(data), size);
  DirectiveParse parse = ParseJobDirectives(script);
  std::vector<std::string_view> lines = Lines(script);
  for (size_t i = 0; i < parse.errors.size(); ++i) {
    Check(IsDirectiveLine(lines, parse.errors[i].line), "an error on a line that is no #DW");
    Check(i == 0 || parse.errors[i - 1].line <= parse.errors[i].line, "errors out of line order");
  }
  const JobDirectives& d = parse.directives;
  if (d.jobdw) {
    Check(IsDirectiveLine(lines, d.jobdw->line), "jobdw on a line that is no #DW");
    Check(d.jobdw->capacity_bytes > 0, "jobdw with capacity 0");
    Check(IsDnsLabel(d.jobdw->pool), "jobdw pool not a DNS label");
  }
  std::set<std::string> names;
  for (const StageInDirective& s : d.stage_ins) {
    Check(IsDirectiveLine(lines, s.line), "stage_in on a line that is no #DW");
    Check(s.source.starts_with('/'), "stage_in source not absolute");
    Check(IsDnsLabel(s.name) && s.name.size() <= kMaxStageInNameLength, "stage_in name");
    Check(names.insert(s.name).second, "stage_in name twice");
    Check(d.jobdw.has_value() || !parse.errors.empty(), "stage_in accepted without jobdw");
  }
  for (const PersistentDwDirective& p : d.persistent) {
    Check(IsDirectiveLine(lines, p.line), "persistentdw on a line that is no #DW");
    Check(ValidateDatasetName(p.name).ok(), "persistentdw name not a dataset name");
  }
  return 0;
}
