#pragma once

// CliContext: what every `granary` command shares: the output streams, the
// global options (--store, --output), the metadata store opened on first use,
// progress lines, and the table of handlers RunCli dispatches to. Plus the
// small formatting helpers the commands print with (sizes, durations, tables,
// dataset JSON) and ProgressMeter, the one progress line of every long
// command (files or chunks and bytes done, rate, ETA).
//
// Adding a command: write cli/src/<name>_command.cc with a function
//   void Add<Name>Command(CLI::App& app, CliContext& context);
// that adds its subcommand(s) to `app` and registers each handler with
// context.OnParsed(subcommand, handler); then add one line to command_list.h
// (and the file to cli/CMakeLists.txt). The variables its options are bound
// to live in an object the context keeps for the run (Keep), so nothing is
// global.
//
// Who uses it: RunCli (cli.cc) builds one per run; the command files.
//
// Thread safety: one thread (the command's). A command that starts threads
// must not touch the context from them.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "granary/core/config.h"
#include "granary/core/metadata_store.h"
#include "granary/core/status.h"
#include "granary/peer/peer_auth.h"
#include "granary/peer/peer_transport.h"
#include "granary/peer/tls.h"

namespace CLI {
class App;
}  // namespace CLI

namespace granary::cli {

using Json = nlohmann::ordered_json;
using SteadyClock = std::chrono::steady_clock;

// Where `granary cluster-key generate` writes, and the CLI looks by default.
inline constexpr const char* kDefaultClusterKeyFile = kDefaultClusterKeyPath;

class CliContext {
 public:
  // `stdout_fd` >= 0: commands that write raw bytes (cat) write them to this
  // descriptor instead of through `out` (see RunCli in cli.h).
  CliContext(std::ostream& out, std::ostream& err, bool interactive, int stdout_fd)
      : out_(out), err_(err), interactive_(interactive), stdout_fd_(stdout_fd) {}
  CliContext(const CliContext&) = delete;
  CliContext& operator=(const CliContext&) = delete;

  std::ostream& out() { return out_; }
  std::ostream& err() { return err_; }
  bool interactive() const { return interactive_; }
  int stdout_fd() const { return stdout_fd_; }

  // The global options (bound to the parser by RunCli).
  std::string& store_option() { return store_url_; }
  std::string& output_option() { return output_; }
  std::string& cluster_key_option() { return cluster_key_file_; }
  std::string& tls_ca_option() { return tls_ca_file_; }
  std::string& transport_option() { return transport_; }
  std::string& libfabric_provider_option() { return libfabric_provider_; }
  bool json_output() const { return output_ == "json"; }

  // --store, else $GRANARY_STORE, else DefaultStoreUrl().
  std::string StoreUrl() const;
  // What the CLI proves to cache nodes that require authentication: the
  // cluster key from --cluster-key-file, else $GRANARY_CLUSTER_KEY_FILE (an
  // error if it cannot be loaded), else /etc/granary/cluster.key when this
  // user can read it (root), else none.
  Result<ClientCredentials> PeerCredentials() const;
  // The key file PeerCredentials loads, or empty for none.
  std::string ClusterKeyPath() const;
  // How to speak to cache nodes that serve TLS: verified against
  // --tls-ca-file (else $GRANARY_TLS_CA_FILE) when given, else unverified.
  Result<std::shared_ptr<TlsContext>> Tls() const;
  std::string TlsCaPath() const;
  // --transport libfabric (with --libfabric-provider): the fabric transport
  // for nodes that offer it; null for tcp, and (after a warning on stderr
  // naming what is missing) when the provider is not usable here.
  std::shared_ptr<PeerTransport> Fabric();
  // Opens the store once (creating the directory of the embedded SQLite file);
  // the error says how to point the CLI elsewhere.
  Status OpenStore();
  // For commands that only read: a SQLite store that does not exist is an
  // error saying so, and nothing is created (OpenExistingMetadataStore).
  Status OpenExistingStore();
  MetadataStore& store() { return *store_; }

  // A progress line on stderr: redrawn in place on a terminal; otherwise a
  // plain line at most every kPlainProgressEvery (and always the final one).
  // Nothing with -o json.
  static constexpr std::chrono::seconds kPlainProgressEvery{5};
  void Progress(const std::string& line, bool final);

  // Registers the handler of `app`: RunCli runs the one whose subcommand
  // was parsed.
  void OnParsed(CLI::App* app, std::function<Status()> run);
  // The handler of the parsed subcommand; null when none was.
  std::function<Status()> ParsedHandler() const;

  // Keeps a command's state (the variables its options are bound to, which
  // its handlers use) alive for the run.
  template <typename T>
  T* Keep(std::unique_ptr<T> state) {
    T* raw = state.get();
    kept_.push_back(std::shared_ptr<void>(std::move(state)));
    return raw;
  }

 private:
  // OpenStore (create: true) and OpenExistingStore.
  Status Open(bool create);
  std::ostream& out_;
  std::ostream& err_;
  const bool interactive_;
  const int stdout_fd_;
  std::string store_url_;
  std::string output_ = "human";
  std::string cluster_key_file_;
  std::string tls_ca_file_;
  std::string transport_ = "tcp";
  std::string libfabric_provider_ = "tcp";
  std::unique_ptr<MetadataStore> store_;
  SteadyClock::time_point last_progress_{};
  bool progress_drawn_ = false;
  std::vector<std::pair<CLI::App*, std::function<Status()>>> handlers_;
  std::vector<std::shared_ptr<void>> kept_;
};

using granary::HumanBytes;  // core/config.h
// "1h02m03s", "4m05s", "7s"; "--" for negative or absurd values.
std::string HumanDuration(double seconds);
// Columns padded to their widest cell, two spaces apart.
void PrintTable(std::ostream& out, const std::vector<std::vector<std::string>>& rows);
// The exit code (cli.h) of a command's Status.
int ExitCodeOf(const Status& status);
// The other way: a Status of the class an exit code stands for (a command run
// in-process or in a child), carrying `message`. kCliOk gives OK.
Status StatusOfExitCode(int code, std::string message);
std::string ExitCodesHelp();

Json DatasetJson(const DatasetRecord& d);
Json ProgressJson(const ProgressSummary& s);

// "uid 1000 ('alice')": the name when the user database knows the id.
std::string UserName(uint32_t uid);
std::string GroupName(uint32_t gid);
// The other way: a user (group) name or a numeric id, as the user database
// knows it; an error naming `option` and the fix otherwise. A numeric id the
// database does not know is taken as it is (sites with ids from a directory
// that this host does not see).
Result<uint32_t> UserIdOf(const std::string& option, const std::string& user);
Result<uint32_t> GroupIdOf(const std::string& option, const std::string& group);
// "root and its owner (uid 1000)", then "; user alice (1001)", "; group ml (2000)".
std::string ReadersText(const DatasetRecord& d);

// One progress line for a long command:
//   "imagenet [######....] 42.0%  940/2242 chunks  58.8 GiB/140.1 GiB  2.1 GiB/s  ETA 39s  Staging"
// A total of 0 is unknown: no bar, percentage or ETA (a snapshot does not know
// how many files it will find unless a previous snapshot says). The rate is
// measured over the last kRateWindow (bytes when bytes are known, else items).
struct ProgressCounts {
  uint64_t items = 0;
  uint64_t items_total = 0;  // 0: unknown
  uint64_t bytes = 0;
  uint64_t bytes_total = 0;  // 0: unknown
  bool has_bytes = true;     // false: bytes are not counted (snapshot walk)
};

class ProgressMeter {
 public:
  static constexpr std::chrono::seconds kRateWindow{20};

  // `items_unit`: "files", "chunks".
  ProgressMeter(std::string label, std::string items_unit, SteadyClock::time_point start);

  std::string Line(const ProgressCounts& counts, SteadyClock::time_point now,
                   std::string_view note = {});
  // Units per second over the window (bytes if counted, else items); 0 until
  // two observations are at least 0.5 s apart.
  double rate() const { return rate_; }
  // Seconds left at that rate; negative when unknown.
  double eta() const { return eta_; }

 private:
  struct Point {
    SteadyClock::time_point at;
    uint64_t value = 0;
  };
  std::string label_;
  std::string items_unit_;
  SteadyClock::time_point start_;
  std::vector<Point> points_;  // within the window (bounded: trimmed on every Line)
  double rate_ = 0;
  double eta_ = -1;
};

}  // namespace granary::cli
