#pragma once

// What every daemon's main does the same way, so granary-cachenode,
// granary-sidecar and granary-operator behave alike from the command line:
//  - the command line (CLI11): --help exits 0; a bad command line exits 2
//    with CLI11's message; every daemon takes --log-level, and the ones with
//    a YAML file take -c/--config (required) and --check;
//  - messages on stderr as "<binary>: <what>", exit status 2 for a bad
//    command line or configuration (a file that fails to load: the loader's
//    message names the file and line), 1 when start-up fails at run time;
//  - the log level: --log-level when given, else the configuration's, set on
//    every logger before the daemon starts;
//  - signals: SIGPIPE ignored (a peer that went away is EPIPE on write, not
//    the daemon's death) and SIGTERM/SIGINT blocked in every thread, then
//    waited for on the main thread (stop_signals.h), which stops the daemon.
//
// Who calls it: cachenode/src/main.cc, sidecar/src/main.cc,
// operator/src/main.cc; tests/daemon/daemon_main_test.cc.
//
// Thread safety: main thread only. PrepareSignals must run before the daemon
// starts any thread, so that every thread inherits the blocked signals.

#include <signal.h>
#include <spdlog/common.h>

#include <optional>
#include <string>
#include <string_view>

#include "granary/core/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace granary {

// The daemons' exit statuses.
inline constexpr int kDaemonExitOk = 0;
inline constexpr int kDaemonExitRuntime = 1;  // start-up failed at run time
inline constexpr int kDaemonExitUsage = 2;    // a bad command line or configuration

class DaemonMain {
 public:
  // `name` is the binary's ("granary-sidecar"), the prefix of every message.
  // Adds --log-level to `app`, which must outlive this object.
  DaemonMain(std::string name, CLI::App& app);

  DaemonMain(const DaemonMain&) = delete;
  DaemonMain& operator=(const DaemonMain&) = delete;

  // Adds -c/--config (required; `doc` says where the file is described) and
  // --check (check the configuration and exit).
  void AddConfigFile(const std::string& doc);

  // Parses the command line. nullopt: go on. Otherwise the exit status to
  // return: 0 after --help, kDaemonExitUsage for a bad command line or a bad
  // --log-level (the message printed).
  std::optional<int> Parse(int argc, char** argv);

  const std::string& name() const { return name_; }
  const std::string& config_path() const { return config_path_; }
  bool check() const { return check_; }

  // Prints "<name>: <message>" on stderr; returns kDaemonExitUsage.
  int Usage(std::string_view message) const;
  // A configuration that could not be loaded: prints "<name>: <its message>"
  // on stderr; returns kDaemonExitUsage.
  int BadConfig(const Status& status) const;
  // Start-up failed at run time: prints "<name>: <status>" on stderr;
  // returns kDaemonExitRuntime.
  int StartFailed(const Status& status) const;

  // The level to run at: --log-level when given, else `configured` (the
  // configuration's). Sets it on every logger and returns it, so that the
  // daemon's configuration can be made to agree.
  spdlog::level::level_enum ApplyLogLevel(spdlog::level::level_enum configured) const;

  // Ignores SIGPIPE and blocks SIGTERM and SIGINT in the calling thread (and
  // so in every thread started after). Call before the daemon starts threads.
  void PrepareSignals();

  // Waits for SIGTERM or SIGINT (PrepareSignals first), logs "received
  // SIGTERM: stopping" on `component`'s logger and returns the signal's name.
  std::string_view WaitForStop(const std::string& component) const;

 private:
  const std::string name_;
  CLI::App& app_;
  std::string log_level_text_;                          // --log-level as given; empty when not
  std::optional<spdlog::level::level_enum> log_level_;  // parsed by Parse
  std::string config_path_;
  bool check_ = false;
  sigset_t stop_signals_{};
  bool signals_prepared_ = false;
};

}  // namespace granary
