// The #DW directives of a job script (directives.h, docs/slurm.md).
// Kept whole at about 640 lines: its one job is those directives, parsed and
// checked into one list of errors in line order. The checks that look at the
// world (CheckJobDirectives, about 100 lines) complete the parser's rules on
// the same types and the same error list, and the job-id helpers at the end
// rewrite the same directive lines; the fuzz target compiles this file in
// alone (tests/fuzz/CMakeLists.txt).

#include "granary/slurm/directives.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "granary/core/config.h"
#include "granary/core/names.h"

namespace granary::slurm {
namespace {

constexpr std::string_view kDirectivePrefix = "#DW";
constexpr std::string_view kSupported =
    "Granary supports #DW jobdw, #DW stage_in and #DW persistentdw (docs/slurm.md)";

bool IsSpace(char c) { return c == ' ' || c == '\t'; }

std::vector<std::string_view> SplitWords(std::string_view text) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && IsSpace(text[i])) ++i;
    size_t start = i;
    while (i < text.size() && !IsSpace(text[i])) ++i;
    if (i > start) words.push_back(text.substr(start, i - start));
  }
  return words;
}

// One directive line: its kind and key=value options, with the errors found
// on the way.
// The %j stand-in when the job id is not known: as long as the longest id.
constexpr std::string_view kJobIdStandIn = "4294967294";

// Replaces the '%' symbols of one value the way Slurm's copy will have them
// (burst_buffer_common.c, _handle_replacement), for the symbols every step can
// know: %% and %j. Sets *symbolic when the job id was not known. Returns the
// reason when the value cannot be taken.
std::optional<std::string> ReplaceSymbols(std::string_view value, const ScriptSymbols& symbols,
                                          std::string* out, bool* symbolic) {
  out->clear();
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] != '%') {
      out->push_back(value[i]);
      continue;
    }
    if (i + 1 == value.size()) {
      return std::string("ends in a lone '%'; write %% for a '%'");
    }
    char c = value[++i];
    std::string symbol = std::string("%") + c;
    switch (c) {
      case '%':
        out->push_back('%');
        break;
      case 'j':
        if (symbols.job_id.empty()) {
          *out += kJobIdStandIn;
          *symbolic = true;
        } else {
          *out += symbols.job_id;
        }
        break;
      case 'A':
      case 'a':
      case 'd':
      case 'u':
      case 'x': {
        const char* what = c == 'A'   ? "the array's job id"
                           : c == 'a' ? "the array task id"
                           : c == 'd' ? "the working directory"
                           : c == 'u' ? "the user name"
                                      : "the job name";
        return symbol + " (" + what +
               ") is not supported: Slurm replaces it only in the copy it gives setup and "
               "data_in, while paths and the node prolog get the script as submitted and are not "
               "told it; write the value itself (%j, the job id, and %% are supported)";
      }
      default:
        return Quoted(symbol) +
               " is not a Slurm symbol: Slurm deletes it (both characters) from the copy it "
               "gives the later steps; write %% for a '%' (symbols: %%, %j)";
    }
  }
  return std::nullopt;
}

class LineParser {
 public:
  LineParser(int line, std::string kind, std::vector<DirectiveError>& errors,
             const ScriptSymbols& symbols)
      : line_(line), kind_(std::move(kind)), errors_(errors), symbols_(symbols) {}

  void Error(const std::string& reason) {
    errors_.push_back({line_, "#DW " + kind_ + ": " + reason});
    failed_ = true;
  }
  bool failed() const { return failed_; }

  // Reads the options; `allowed` are the keys this kind takes.
  void ReadOptions(const std::vector<std::string_view>& words,
                   const std::vector<std::string_view>& allowed) {
    for (size_t i = 1; i < words.size(); ++i) {
      std::string_view word = words[i];
      size_t eq = word.find('=');
      if (eq == std::string_view::npos || eq == 0) {
        Error("expected key=value, found " + Quoted(word));
        continue;
      }
      std::string key(word.substr(0, eq));
      std::string_view value = word.substr(eq + 1);
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        std::string keys;
        for (std::string_view k : allowed) keys += (keys.empty() ? "" : ", ") + std::string(k);
        Error("unknown key " + Quoted(key) + "; its keys are " + keys);
        continue;
      }
      if (value.empty()) {
        Error(key + "= has no value");
        continue;
      }
      given_.insert(key);
      std::string resolved(value);
      if (!symbols_.replaced && value.find('%') != std::string_view::npos) {
        if (key != "source" && key != "destination" && key != "name") {
          Error(key + "=" + std::string(value) +
                ": Slurm reads this value as written, before it replaces '%' symbols; write it "
                "without '%' (symbols are taken in source=, destination= and name=)");
          continue;
        }
        bool symbolic = false;
        if (std::optional<std::string> bad =
                ReplaceSymbols(value, symbols_, &resolved, &symbolic)) {
          Error(key + "=" + std::string(value) + ": " + *bad);
          continue;
        }
        if (symbolic) symbolic_.insert(key);
      }
      if (!options_.emplace(key, resolved).second) {
        Error(key + "= is given twice; give it once");
      } else {
        raw_.emplace(key, std::string(value));
      }
    }
  }

  // The value as written (before %j was replaced), and whether it held %j
  // with no job id to put there.
  const std::string& Raw(const std::string& key) const { return raw_.at(key); }
  bool Symbolic(const std::string& key) const { return symbolic_.contains(key); }
  // Given with a value, even one refused for its '%' symbols: not "missing".
  bool Given(const std::string& key) const { return given_.contains(key); }

  const std::string* Get(const std::string& key) const {
    auto it = options_.find(key);
    return it == options_.end() ? nullptr : &it->second;
  }

 private:
  int line_;
  std::string kind_;
  std::vector<DirectiveError>& errors_;
  const ScriptSymbols& symbols_;
  std::map<std::string, std::string> options_;
  std::map<std::string, std::string> raw_;
  std::set<std::string> symbolic_;
  std::set<std::string> given_;
  bool failed_ = false;
};

void ParseJobDw(LineParser& p, int line, const std::vector<std::string_view>& words,
                DirectiveParse& out) {
  p.ReadOptions(words, {"type", "access_mode", "capacity", "pool"});
  JobDwDirective d;
  d.line = line;
  if (const std::string* type = p.Get("type")) {
    if (*type == "cache") {
      p.Error("type=cache is not supported; write type=scratch");
    } else if (*type != "scratch") {
      p.Error("unknown type " + Quoted(*type) + "; write type=scratch");
    }
  }
  if (const std::string* mode = p.Get("access_mode")) {
    if (mode->find("private") != std::string::npos) {
      p.Error("access_mode=" + *mode + " is not supported (no private mode); write " +
              "access_mode=striped");
    } else if (*mode != "striped") {
      p.Error("unknown access_mode " + Quoted(*mode) + "; write access_mode=striped");
    }
  }
  if (const std::string* capacity = p.Get("capacity")) {
    Result<ByteSize> size = ParseByteSize(*capacity);
    if (!size.ok()) {
      p.Error("capacity=" + Quoted(*capacity) + " is not a size (" + size.status().message() +
              "); write e.g. capacity=100GiB");
    } else if (size->bytes == 0) {
      p.Error("capacity must be more than 0; write e.g. capacity=100GiB");
    } else {
      d.capacity_bytes = size->bytes;
    }
  } else if (!p.Given("capacity")) {
    p.Error("capacity= is missing; write e.g. capacity=100GiB");
  }
  if (const std::string* pool = p.Get("pool")) {
    if (!IsDnsLabel(*pool)) {
      p.Error("pool " + Quoted(*pool) + " is not a pool name (lowercase letters, digits, '-')");
    } else {
      d.pool = *pool;
    }
  } else if (!p.Given("pool")) {
    // Slurm itself refuses capacity= without pool= ("Must specify pool with
    // capacity"), with no line; say it here with one.
    p.Error(
        "pool= is missing; Slurm needs a pool with capacity=: write e.g. pool=default "
        "(granary slurm pools lists them)");
  }
  if (out.directives.jobdw) {
    p.Error("a second #DW jobdw (the first is on line " +
            std::to_string(out.directives.jobdw->line) + "); a job has one");
  }
  if (!p.failed()) out.directives.jobdw = d;
}

// The name after $DW_JOB_STRIPED/ (or ${DW_JOB_STRIPED}/); empty with an
// error when the destination is anything else.
std::string DestinationName(LineParser& p, const std::string& destination) {
  std::string_view rest = destination;
  std::string_view braced = "${DW_JOB_STRIPED}";
  if (rest.starts_with(braced)) {
    rest.remove_prefix(braced.size());
  } else if (rest.starts_with(kJobStripedVariable)) {
    rest.remove_prefix(kJobStripedVariable.size());
  } else {
    p.Error("destination " + Quoted(destination) +
            " is outside $DW_JOB_STRIPED; write destination=$DW_JOB_STRIPED/<name>");
    return {};
  }
  if (!rest.starts_with('/')) {
    p.Error("destination " + Quoted(destination) +
            " is not a name under $DW_JOB_STRIPED; write destination=$DW_JOB_STRIPED/<name>");
    return {};
  }
  rest.remove_prefix(1);
  while (rest.ends_with('/')) rest.remove_suffix(1);
  if (!IsDnsLabel(rest) || rest.size() > kMaxStageInNameLength) {
    p.Error("destination name " + Quoted(rest) + " must be one name of 1.." +
            std::to_string(kMaxStageInNameLength) +
            " lowercase letters, digits and '-' (starting and ending with a letter or digit), " +
            "e.g. destination=$DW_JOB_STRIPED/imagenet");
    return {};
  }
  return std::string(rest);
}

void ParseStageIn(LineParser& p, int line, const std::vector<std::string_view>& words,
                  DirectiveParse& out) {
  p.ReadOptions(words, {"type", "source", "destination"});
  StageInDirective d;
  d.line = line;
  if (const std::string* type = p.Get("type")) {
    if (*type == "file" || *type == "list") {
      p.Error("type=" + *type + " is not supported; stage a directory with type=directory");
    } else if (*type != "directory") {
      p.Error("unknown type " + Quoted(*type) + "; write type=directory");
    }
  }
  if (const std::string* source = p.Get("source")) {
    if (!source->starts_with('/')) {
      p.Error("source " + Quoted(*source) +
              " is not an absolute path (variables are not expanded); write source=/path/to/dir");
    } else {
      d.source = *source;
      if (p.Symbolic("source")) {
        d.source_written = p.Raw("source");
        d.symbolic = true;
      }
    }
  } else if (!p.Given("source")) {
    p.Error("source= is missing; write source=/path/to/dir");
  }
  if (const std::string* destination = p.Get("destination")) {
    d.name = DestinationName(p, *destination);
    if (!d.name.empty() && p.Symbolic("destination")) {
      // Checked with the stand-in; as written: "$DW_JOB_STRIPED/data-%j".
      std::string_view raw = p.Raw("destination");
      raw.remove_prefix(raw.find('/') + 1);
      while (raw.ends_with('/')) raw.remove_suffix(1);
      d.name_written = std::string(raw);
      d.symbolic = true;
    }
  } else if (!p.Given("destination")) {
    p.Error("destination= is missing; write destination=$DW_JOB_STRIPED/<name>");
  }
  if (!d.name.empty()) {
    for (const StageInDirective& other : out.directives.stage_ins) {
      if (other.name == d.name) {
        p.Error("destination $DW_JOB_STRIPED/" + d.name + " is already staged in on line " +
                std::to_string(other.line) + "; give each stage_in its own name");
      }
    }
  }
  if (!p.failed()) out.directives.stage_ins.push_back(std::move(d));
}

void ParsePersistentDw(LineParser& p, int line, const std::vector<std::string_view>& words,
                       DirectiveParse& out) {
  p.ReadOptions(words, {"name"});
  PersistentDwDirective d;
  d.line = line;
  if (const std::string* name = p.Get("name")) {
    Status valid = ValidateDatasetName(*name);
    if (!valid.ok()) {
      p.Error("name " + Quoted(*name) + " is not a dataset name: " + valid.message());
    } else {
      d.name = *name;
      if (p.Symbolic("name")) {
        d.name_written = p.Raw("name");
        d.symbolic = true;
      }
    }
  } else if (!p.Given("name")) {
    p.Error("name= is missing; write name=<dataset> (a dataset made with granary dataset create)");
  }
  for (const PersistentDwDirective& other : out.directives.persistent) {
    if (!d.name.empty() && other.name == d.name) {
      p.Error("dataset " + Quoted(d.name) + " is already named on line " +
              std::to_string(other.line) + "; name it once");
    }
  }
  if (!p.failed()) out.directives.persistent.push_back(std::move(d));
}

void SortErrors(std::vector<DirectiveError>& errors) {
  std::stable_sort(
      errors.begin(), errors.end(),
      [](const DirectiveError& a, const DirectiveError& b) { return a.line < b.line; });
}

bool IsDirectiveStart(std::string_view line) {
  if (!line.starts_with(kDirectivePrefix)) return false;
  std::string_view rest = line.substr(kDirectivePrefix.size());
  return rest.empty() || IsSpace(rest.front());  // e.g. #DWX: not ours
}

struct PhysicalLine {
  std::string_view text;  // without its '\n' and a Windows '\r'
  bool had_cr = false;
};

std::vector<PhysicalLine> SplitLines(std::string_view script) {
  std::vector<PhysicalLine> lines;
  size_t pos = 0;
  while (pos <= script.size()) {
    size_t end = script.find('\n', pos);
    if (end == std::string_view::npos) end = script.size();
    PhysicalLine line{script.substr(pos, end - pos)};
    pos = end + 1;
    if (line.text.ends_with('\r')) {
      line.text.remove_suffix(1);
      line.had_cr = true;
    }
    lines.push_back(line);
  }
  return lines;
}

}  // namespace

std::string DirectiveError::ToString() const {
  return "line " + std::to_string(line) + ": " + reason;
}

DirectiveParse ParseJobDirectives(std::string_view script, const ScriptSymbols& symbols) {
  DirectiveParse out;
  bool any_stage_in = false;
  bool any_jobdw = false;  // even one with errors: its errors say what to fix
  int first_stage_in_line = 0;
  std::vector<PhysicalLine> lines = SplitLines(script);
  // Slurm reads #DW lines only up to the first line that is neither empty
  // nor a '#' comment (_xlate_batch: "Quit at first non-comment").
  int first_command = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const int line_number = static_cast<int>(i) + 1;
    const PhysicalLine& physical = lines[i];
    if (first_command == 0 && (!physical.text.empty() || physical.had_cr) &&
        !physical.text.starts_with('#')) {
      first_command = line_number;
    }
    if (!IsDirectiveStart(lines[i].text)) continue;
    if (first_command != 0) {
      out.errors.push_back({line_number, "#DW after the script's first command (line " +
                                             std::to_string(first_command) +
                                             "): Slurm reads #DW lines only before it and "
                                             "ignores this one; move it up"});
      continue;
    }
    // Slurm's merge (burst_buffer_lua.c, _xlate_batch): a #DW line ending in
    // '\' goes on on the next line that starts with #DW, without that line's
    // "#DW"; when a space came before the '\' that line's leading white
    // space is dropped too. Empty lines in between are skipped, as strtok
    // skips them.
    std::string text(lines[i].text.substr(kDirectivePrefix.size()));
    std::string merge_error;
    size_t at = i;
    while (!text.empty() && text.back() == '\\') {
      const PhysicalLine& here = lines[at];
      const int here_number = static_cast<int>(at) + 1;
      if (here.had_cr) {
        merge_error = "line " + std::to_string(here_number) +
                      " ends in '\\' and a Windows line end: Slurm does not go on to the next "
                      "line then; save the script with Unix line ends";
        break;
      }
      bool has_space = here.text.size() >= 2 && IsSpace(here.text[here.text.size() - 2]);
      size_t next = at + 1;
      while (next < lines.size() && lines[next].text.empty() && !lines[next].had_cr) ++next;
      if (next >= lines.size() || (next + 1 == lines.size() && lines[next].text.empty())) {
        merge_error = "line " + std::to_string(here_number) +
                      " ends in '\\' but no line follows to go on on; remove the '\\'";
        break;
      }
      if (!lines[next].text.starts_with(kDirectivePrefix)) {
        merge_error = "line " + std::to_string(here_number) + " ends in '\\' but line " +
                      std::to_string(next + 1) +
                      " does not start with #DW: Slurm ends the directive there and drops the "
                      "'\\'; go on on a line starting with #DW, or remove the '\\'";
        break;
      }
      text.pop_back();
      std::string_view more = lines[next].text.substr(kDirectivePrefix.size());
      if (has_space) {
        while (!more.empty() &&
               (IsSpace(more.front()) || more.front() == '\v' || more.front() == '\f')) {
          more.remove_prefix(1);
        }
      }
      text += more;
      at = next;
    }
    i = at;
    if (!merge_error.empty()) {
      out.errors.push_back({line_number, "#DW: " + merge_error});
      continue;
    }
    if (text.find("\\\\") != std::string::npos) {
      out.errors.push_back(
          {line_number,
           "#DW: '\\\\' in a directive is not supported: Slurm stops replacing '%' symbols "
           "after it; write the directive without it"});
      continue;
    }
    std::vector<std::string_view> words = SplitWords(text);
    if (words.empty()) {
      out.errors.push_back({line_number, "#DW with no directive; " + std::string(kSupported)});
      continue;
    }
    std::string kind(words[0]);
    LineParser parser(line_number, kind, out.errors, symbols);
    if (kind == "jobdw") {
      any_jobdw = true;
      ParseJobDw(parser, line_number, words, out);
    } else if (kind == "stage_in") {
      if (!any_stage_in) first_stage_in_line = line_number;
      any_stage_in = true;
      ParseStageIn(parser, line_number, words, out);
    } else if (kind == "persistentdw") {
      ParsePersistentDw(parser, line_number, words, out);
    } else if (kind == "stage_out" || kind == "swap" || kind == "create_persistent" ||
               kind == "destroy_persistent") {
      out.errors.push_back(
          {line_number, "#DW " + kind + " is not supported; " + std::string(kSupported)});
    } else {
      out.errors.push_back(
          {line_number, "unknown directive #DW " + Quoted(kind) + "; " + std::string(kSupported)});
    }
  }
  // stage_in places a dataset under the job's instance: without a jobdw line
  // there is none.
  if (any_stage_in && !any_jobdw) {
    out.errors.push_back({first_stage_in_line,
                          "#DW stage_in needs a job-scoped instance: add a line "
                          "'#DW jobdw type=scratch access_mode=striped capacity=<size>'"});
  }
  SortErrors(out.errors);
  return out;
}

bool NeedsStore(const JobDirectives& directives) {
  return directives.jobdw.has_value() || !directives.persistent.empty();
}

namespace {

// The datasets granary-operator made from Kubernetes Datasets named `name`:
// GranaryDatasetName gives <namespace>-<name>-<10 hex> (operator/resources.h;
// a long <namespace>-<name> is cut at 52 characters, which this does not
// try to match).
Result<std::vector<std::string>> KubernetesNamesFor(MetadataStore& store, const std::string& name) {
  GRANARY_ASSIGN_OR_RETURN(std::vector<DatasetRecord> records, store.ListDatasets());
  std::vector<std::string> out;
  const std::string middle = "-" + name + "-";
  constexpr size_t kHash = 10;
  for (const DatasetRecord& r : records) {
    const std::string& n = r.name;
    if (n.size() < middle.size() + kHash + 1) continue;
    const std::string_view hash = std::string_view(n).substr(n.size() - kHash);
    if (hash.find_first_not_of("0123456789abcdef") != std::string_view::npos) continue;
    if (n.compare(n.size() - kHash - middle.size(), middle.size(), middle) != 0) continue;
    out.push_back(n);
  }
  return out;
}

}  // namespace

std::string PersistentDwRefusal(const DatasetRecord& dataset, const JobUser& user) {
  if (MayReadDataset(dataset, user.uid, user.gid, user.groups)) return "";
  const std::string who = user.name.empty() ? "uid " + std::to_string(user.uid)
                                            : user.name + " (uid " + std::to_string(user.uid) + ")";
  const std::string whom = user.name.empty() ? std::to_string(user.uid) : user.name;
  return "#DW persistentdw: " + who + " may not read dataset " + Quoted(dataset.name) +
         ": it belongs to uid " + std::to_string(dataset.owner.uid) +
         (dataset.readers.empty() ? ", who granted it to no one"
                                  : ", who did not grant it to this user or a group of theirs") +
         "; its owner can ask an admin to run `granary dataset grant " + dataset.name + " --user " +
         whom + "` (or --group GROUP), or use a dataset of your own";
}

Result<DatasetRecord> PersistentDwDataset(MetadataStore& store, const PersistentDwDirective& p,
                                          const JobUser& user, std::string_view job_id) {
  const std::string job = "job " + std::string(job_id);
  Result<DatasetRecord> record = store.GetDataset(p.name);
  if (!record.ok()) {
    return record.status().WithContext(job + ": persistentdw dataset " + Quoted(p.name) +
                                       " (line " + std::to_string(p.line) + ")");
  }
  if (std::string refusal = PersistentDwRefusal(*record, user); !refusal.empty()) {
    return Status::PermissionDenied(job + ": line " + std::to_string(p.line) + ": " + refusal);
  }
  return record;
}

Status CheckJobDirectives(DirectiveParse& parse, MetadataStore* store, const JobUser* user) {
  JobDirectives& d = parse.directives;
  if (store == nullptr && NeedsStore(d)) {
    return Status::Internal("checking #DW directives: jobdw and persistentdw need the store");
  }
  for (const StageInDirective& s : d.stage_ins) {
    if (s.symbolic) continue;  // %j: setup looks at it, with the job id
    struct stat st;
    if (stat(s.source.c_str(), &st) != 0) {
      int e = errno;
      // EACCES: this host's checking user may not look; the job's user may.
      // Setup reads the source as the job's user and holds the job if not.
      if (e == ENOENT || e == ENOTDIR) {
        parse.errors.push_back({s.line, "#DW stage_in: source " + Quoted(s.source) +
                                            " does not exist; name an existing directory"});
      } else if (e != EACCES) {
        parse.errors.push_back({s.line, "#DW stage_in: source " + Quoted(s.source) +
                                            " cannot be checked: " + ErrnoText(e)});
      }
    } else if (!S_ISDIR(st.st_mode)) {
      parse.errors.push_back({s.line, "#DW stage_in: source " + Quoted(s.source) +
                                          " is not a directory; type=directory stages a "
                                          "directory"});
    }
  }
  if (d.jobdw) {
    GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, store->ListNodes(""));
    std::set<std::string> pools;
    for (const NodeRecord& n : nodes) pools.insert(n.pool);
    if (!pools.contains(d.jobdw->pool)) {
      std::string known;
      for (const std::string& p : pools) known += (known.empty() ? "" : ", ") + p;
      parse.errors.push_back(
          {d.jobdw->line, "#DW jobdw: unknown pool " + Quoted(d.jobdw->pool) + "; " +
                              (known.empty() ? std::string("no pool has a live cache node")
                                             : "the pools with live cache nodes are " + known) +
                              " (granary node list)"});
    }
  }
  for (const PersistentDwDirective& p : d.persistent) {
    if (p.symbolic) continue;  // %j: data_in waits for it, with the job id
    Result<DatasetRecord> record = store->GetDataset(p.name);
    if (record.status().code() == StatusCode::kNotFound) {
      GRANARY_ASSIGN_OR_RETURN(std::vector<std::string> named, KubernetesNamesFor(*store, p.name));
      std::string message = "#DW persistentdw: dataset " + Quoted(p.name) + " does not exist; ";
      if (named.empty()) {
        message += "create it first with granary dataset create " + p.name + " --source DIR";
      } else {
        // A Kubernetes Dataset's name in the store is <namespace>-<name>-<hash>.
        std::string list;
        for (const std::string& n : named) list += (list.empty() ? "" : ", ") + n;
        message +=
            "a Kubernetes Dataset is named in Granary by its status.granaryName (kubectl "
            "get dataset " +
            p.name +
            " -n <namespace> -o jsonpath='{.status.granaryName}'); write name=" + named.front() +
            (named.size() > 1 ? " (or one of " + list + ")" : "");
      }
      parse.errors.push_back({p.line, message});
    } else if (!record.ok()) {
      return record.status();
    } else if (user != nullptr) {
      if (std::string refusal = PersistentDwRefusal(*record, *user); !refusal.empty()) {
        parse.errors.push_back({p.line, std::move(refusal)});
      }
    }
  }
  SortErrors(parse.errors);
  return Status::Ok();
}

bool IsSlurmReplacedScript(std::string_view path) {
  return path.starts_with("/proc/") && path.find("/fd/") != std::string_view::npos;
}

std::string ReplaceJobIdSymbols(std::string_view script, std::string_view job_id) {
  std::string out;
  out.reserve(script.size());
  size_t pos = 0;
  while (pos < script.size()) {
    size_t end = script.find('\n', pos);
    end = end == std::string_view::npos ? script.size() : end + 1;
    std::string_view line = script.substr(pos, end - pos);
    pos = end;
    // Continuation lines start with #DW too (#DWfoo included).
    if (!line.starts_with(kDirectivePrefix)) {
      out += line;
      continue;
    }
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '%' && i + 1 < line.size()) {
        if (line[i + 1] == 'j') {
          out += job_id;
        } else {
          out += line.substr(i, 2);  // %% and the rest stay as they are
        }
        ++i;
      } else {
        out.push_back(line[i]);
      }
    }
  }
  return out;
}

Result<std::string> JobDatasetName(std::string_view job_id, std::string_view name) {
  if (job_id.empty() || job_id.size() > 10 ||
      !std::all_of(job_id.begin(), job_id.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return Status::InvalidArgument("Slurm job id " + Quoted(job_id) +
                                   " is not a number of 1..10 digits");
  }
  std::string dataset =
      std::string(kJobDatasetPrefix) + std::string(job_id) + "-" + std::string(name);
  if (!IsDnsLabel(dataset)) {
    return Status::InvalidArgument("stage_in name " + Quoted(name) + " of job " +
                                   std::string(job_id) + " does not make a dataset name");
  }
  return dataset;
}

}  // namespace granary::slurm
