// `granary ls NAME [PATH] [-l] [-R] [-d]`: a dataset's directories and files
// from its manifest alone (docs/cli.md, "Reading a dataset").

#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli_context.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "manifest_tree.h"

namespace granary::cli {
namespace {

struct LsOptions {
  std::string dataset;
  std::string path;
  bool long_format = false;
  bool recursive = false;
  bool directory = false;
};

// "drwxr-x---", as ls -l shows a mode (s/S, t/T for the special bits).
std::string ModeString(bool directory, uint16_t mode) {
  std::string s = directory ? "d" : "-";
  constexpr uint16_t kSpecial[3] = {04000, 02000, 01000};  // set-user-ID, set-group-ID, sticky
  for (int i = 0; i < 3; ++i) {
    const unsigned bits = static_cast<unsigned>(mode >> (6 - 3 * i)) & 7u;
    s += (bits & 4) != 0 ? 'r' : '-';
    s += (bits & 2) != 0 ? 'w' : '-';
    const bool special = (mode & kSpecial[i]) != 0;
    const bool x = (bits & 1) != 0;
    const char mark = i == 2 ? 't' : 's';
    s += special ? (x ? mark : static_cast<char>(mark - 'a' + 'A')) : (x ? 'x' : '-');
  }
  return s;
}

// "0640".
std::string OctalMode(uint16_t mode) {
  char buffer[8];
  std::snprintf(buffer, sizeof(buffer), "%04o", static_cast<unsigned>(mode));
  return buffer;
}

// Local time, minutes: "2024-05-01 12:34".
std::string LocalTime(int64_t mtime_ns) {
  const time_t seconds = static_cast<time_t>(mtime_ns / 1'000'000'000);
  struct tm tm {};
  char buffer[32];
  if (localtime_r(&seconds, &tm) == nullptr ||
      strftime(buffer, sizeof(buffer), "%Y-%m-%d %H:%M", &tm) == 0) {
    return "?";
  }
  return buffer;
}

// UTC with nanoseconds, for JSON: "2024-05-01T12:34:56.123456789Z".
std::string UtcTime(int64_t mtime_ns) {
  int64_t seconds = mtime_ns / 1'000'000'000;
  int64_t nanos = mtime_ns % 1'000'000'000;
  if (nanos < 0) {
    nanos += 1'000'000'000;
    --seconds;
  }
  const time_t t = static_cast<time_t>(seconds);
  struct tm tm {};
  char buffer[40];
  if (gmtime_r(&t, &tm) == nullptr ||
      strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%S", &tm) == 0) {
    return "?";
  }
  char frac[16];
  std::snprintf(frac, sizeof(frac), ".%09lldZ", static_cast<long long>(nanos));
  return std::string(buffer) + frac;
}

class Lister {
 public:
  Lister(CliContext& c, const LsOptions& o, const DatasetRecord& record, const Manifest& manifest)
      : c_(c), o_(o), record_(record), manifest_(manifest) {
    owner_ = UserName(record.owner.uid);
    group_ = GroupName(record.owner.gid);
  }

  Status Run() {
    GRANARY_ASSIGN_OR_RETURN(std::string path, NormalizeDatasetPath(o_.path));
    GRANARY_ASSIGN_OR_RETURN(TreeNode node, ResolvePath(manifest_, path, record_.name));
    if (c_.json_output()) {
      // Streamed: one entry per line, so a dataset of millions of files is
      // never held as one document.
      c_.out() << "{\n  \"dataset\": " << Json(record_.name).dump()
               << ",\n  \"manifest_id\": " << Json(record_.manifest_id).dump()
               << ",\n  \"path\": " << Json(path).dump() << ",\n  \"entries\": [";
    }
    if (!node.directory || o_.directory) {
      Emit({EntryOf(manifest_, node)});
    } else if (o_.recursive) {
      Recurse(node, true);
    } else {
      Emit(ListChildren(manifest_, node));
    }
    if (c_.json_output()) c_.out() << (first_entry_ ? "]\n}\n" : "\n  ]\n}\n");
    return Status::Ok();
  }

 private:
  // ls -R: the directory's entries, then each subdirectory's, depth first,
  // each under a "path:" heading (human output).
  void Recurse(const TreeNode& dir, bool first) {
    if (!c_.json_output()) {
      if (!first) c_.out() << "\n";
      c_.out() << (dir.path.empty() ? "." : dir.path) << ":\n";
    }
    const std::vector<TreeEntry> children = ListChildren(manifest_, dir);
    Emit(children);
    for (const TreeEntry& e : children) {
      if (e.directory) Recurse(e.node, false);
    }
  }

  void Emit(const std::vector<TreeEntry>& entries) {
    if (c_.json_output()) {
      // Written field by field (an object per entry costs more than the rest
      // of the listing); strings escaped by the JSON library.
      std::ostream& out = c_.out();
      for (const TreeEntry& e : entries) {
        out << (first_entry_ ? "\n    " : ",\n    ") << "{\"name\":" << Json(e.name).dump()
            << ",\"path\":" << Json(e.path).dump() << ",\"type\":\""
            << (e.directory ? "directory" : "file") << "\",\"size\":" << e.size
            << ",\"mtime_ns\":" << e.mtime_ns << ",\"mtime\":\"" << UtcTime(e.mtime_ns)
            << "\",\"mode\":\"" << OctalMode(e.mode) << "\",\"uid\":" << record_.owner.uid
            << ",\"gid\":" << record_.owner.gid;
        if (e.directory) {
          out << ",\"files\":" << e.files << "}";
        } else {
          out << ",\"id\":" << e.node.first << "}";
        }
        first_entry_ = false;
      }
      return;
    }
    if (!o_.long_format) {
      for (const TreeEntry& e : entries) c_.out() << e.name << "\n";
      return;
    }
    std::vector<std::vector<std::string>> rows;
    for (const TreeEntry& e : entries) {
      rows.push_back({ModeString(e.directory, e.mode), owner_, group_, std::to_string(e.size),
                      LocalTime(e.mtime_ns), e.name});
    }
    // Sizes right-aligned, as ls does.
    size_t width = 0;
    for (const auto& row : rows) width = std::max(width, row[3].size());
    for (auto& row : rows) row[3].insert(0, width - row[3].size(), ' ');
    PrintTable(c_.out(), rows);
  }

  CliContext& c_;
  const LsOptions& o_;
  const DatasetRecord& record_;
  const Manifest& manifest_;
  std::string owner_;
  std::string group_;
  bool first_entry_ = true;  // JSON: no entry written yet
};

Status Ls(CliContext& c, const LsOptions& o) {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(o.dataset));
  // The path is checked before anything is read.
  GRANARY_RETURN_IF_ERROR(NormalizeDatasetPath(o.path).status());
  GRANARY_RETURN_IF_ERROR(c.OpenExistingStore());
  GRANARY_ASSIGN_OR_RETURN(DatasetRecord record, c.store().GetDataset(o.dataset));
  GRANARY_ASSIGN_OR_RETURN(std::shared_ptr<const Manifest> manifest,
                           LoadManifest(c.store(), record));
  Lister lister(c, o, record, *manifest);
  return lister.Run();
}

}  // namespace

void AddLsCommand(CLI::App& app, CliContext& context) {
  LsOptions* o = context.Keep(std::make_unique<LsOptions>());
  CLI::App* ls = app.add_subcommand(
      "ls", "List a dataset's directories and files as at its snapshot (from the manifest)");
  ls->add_option("name", o->dataset, "Dataset name")->required();
  ls->add_option("path", o->path, "Directory or file in the dataset (default: its root)");
  ls->add_flag("-l,--long", o->long_format,
               "Mode, owner, group, size and mtime (directories: bytes and newest file beneath)");
  ls->add_flag("-R,--recursive", o->recursive, "List subdirectories too");
  ls->add_flag("-d,--directory", o->directory, "List the directory itself, not its entries");
  context.OnParsed(ls, [&context, o] { return Ls(context, *o); });
}

}  // namespace granary::cli
