#include "granary/daemon/daemon_main.h"

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "granary/core/log.h"
#include "granary/daemon/stop_signals.h"

namespace granary {

DaemonMain::DaemonMain(std::string name, CLI::App& app) : name_(std::move(name)), app_(app) {
  app_.set_version_flag("--version", name_ + " " + GRANARY_VERSION);
  app_.add_option("--log-level", log_level_text_,
                  "trace, debug, info, warn, error or off (default: the configuration's "
                  "log_level, else info)");
}

void DaemonMain::AddConfigFile(const std::string& doc) {
  app_.add_option("-c,--config", config_path_, "The YAML configuration file (" + doc + ")")
      ->required();
  app_.add_flag("--check", check_, "Check the configuration and exit");
}

std::optional<int> DaemonMain::Parse(int argc, char** argv) {
  try {
    app_.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app_.exit(e);  // prints the help or the error
    return code == 0 ? kDaemonExitOk : kDaemonExitUsage;
  }
  if (!log_level_text_.empty()) {
    Result<spdlog::level::level_enum> level = ParseLogLevel(log_level_text_);
    if (!level.ok()) return Usage("--log-level: " + level.status().message());
    log_level_ = *level;
  }
  return std::nullopt;
}

int DaemonMain::Usage(std::string_view message) const {
  std::fprintf(stderr, "%s: %.*s\n", name_.c_str(), static_cast<int>(message.size()),
               message.data());
  return kDaemonExitUsage;
}

int DaemonMain::BadConfig(const Status& status) const { return Usage(status.message()); }

int DaemonMain::StartFailed(const Status& status) const {
  std::fprintf(stderr, "%s: %s\n", name_.c_str(), status.ToString().c_str());
  return kDaemonExitRuntime;
}

spdlog::level::level_enum DaemonMain::ApplyLogLevel(spdlog::level::level_enum configured) const {
  const spdlog::level::level_enum level = log_level_.value_or(configured);
  SetLogLevel(level);
  return level;
}

void DaemonMain::PrepareSignals() {
  std::signal(SIGPIPE, SIG_IGN);
  stop_signals_ = BlockStopSignals();
  signals_prepared_ = true;
}

std::string_view DaemonMain::WaitForStop(const std::string& component) const {
  if (!signals_prepared_) {
    // A programming error: without the signals blocked, SIGTERM would have
    // killed the process instead of reaching sigwait.
    std::fprintf(stderr, "%s: WaitForStop without PrepareSignals\n", name_.c_str());
    std::abort();
  }
  const std::string_view stopped_by = WaitForStopSignal(stop_signals_);
  GetLogger(component)->info("received {}: stopping", stopped_by);
  return stopped_by;
}

}  // namespace granary
