#include "granary/daemon/daemon_main.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/log.h"

namespace granary {
namespace {

using ::testing::HasSubstr;

// Parses `args` (after the program name) with a DaemonMain on a fresh App;
// the exit status, or -1 to go on.
struct Parsed {
  int exit = -1;
  std::string config_path;
  bool check = false;
  std::string err;
  std::string out;
};

Parsed ParseWith(std::vector<std::string> args, bool with_config) {
  CLI::App app{"test daemon"};
  DaemonMain daemon("granary-test", app);
  if (with_config) daemon.AddConfigFile("docs/test.md");
  std::vector<char*> argv;
  std::string program = "granary-test";
  argv.push_back(program.data());
  for (std::string& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  std::optional<int> exit = daemon.Parse(static_cast<int>(argv.size()), argv.data());
  Parsed p;
  p.out = ::testing::internal::GetCapturedStdout();
  p.err = ::testing::internal::GetCapturedStderr();
  p.exit = exit.value_or(-1);
  p.config_path = daemon.config_path();
  p.check = daemon.check();
  return p;
}

TEST(DaemonMainTest, CommandLineExitsZeroForHelpAndTwoWhenBad) {
  Parsed help = ParseWith({"--help"}, true);
  EXPECT_EQ(help.exit, kDaemonExitOk);
  EXPECT_THAT(help.out, HasSubstr("--log-level"));
  EXPECT_THAT(help.out, HasSubstr("--config"));
  EXPECT_THAT(help.out, HasSubstr("docs/test.md"));

  // --version: the daemon's name and the project's version, also without the
  // configuration that is otherwise required.
  Parsed version = ParseWith({"--version"}, true);
  EXPECT_EQ(version.exit, kDaemonExitOk);
  EXPECT_THAT(version.out, HasSubstr("granary-test 0.1.0"));

  EXPECT_EQ(ParseWith({"--bogus-flag"}, false).exit, kDaemonExitUsage);
  EXPECT_EQ(ParseWith({}, true).exit, kDaemonExitUsage) << "--config is required";
  EXPECT_EQ(ParseWith({"--config"}, true).exit, kDaemonExitUsage);
  EXPECT_EQ(ParseWith({"--check"}, false).exit, kDaemonExitUsage)
      << "--check only with a configuration file";

  Parsed loud = ParseWith({"--log-level", "loud"}, false);
  EXPECT_EQ(loud.exit, kDaemonExitUsage);
  EXPECT_THAT(loud.err, HasSubstr("granary-test: --log-level: "));

  Parsed good = ParseWith({"-c", "/etc/x.yaml", "--check", "--log-level", "warn"}, true);
  EXPECT_EQ(good.exit, -1) << good.err;
  EXPECT_EQ(good.config_path, "/etc/x.yaml");
  EXPECT_TRUE(good.check);
}

TEST(DaemonMainTest, LogLevelFromTheFlagElseTheConfiguration) {
  const auto run = [](std::vector<std::string> args, spdlog::level::level_enum configured) {
    CLI::App app{"test daemon"};
    DaemonMain daemon("granary-test", app);
    std::vector<char*> argv;
    std::string program = "granary-test";
    argv.push_back(program.data());
    for (std::string& a : args) argv.push_back(a.data());
    EXPECT_FALSE(daemon.Parse(static_cast<int>(argv.size()), argv.data()).has_value());
    return daemon.ApplyLogLevel(configured);
  };
  EXPECT_EQ(run({}, spdlog::level::warn), spdlog::level::warn);
  EXPECT_EQ(GetLogger("daemon-main-test")->level(), spdlog::level::warn);
  EXPECT_EQ(run({"--log-level", "debug"}, spdlog::level::warn), spdlog::level::debug);
  EXPECT_EQ(GetLogger("daemon-main-test")->level(), spdlog::level::debug);
  SetLogLevel(spdlog::level::info);
}

TEST(DaemonMainTest, MessagesAreNamedAndExitAsDocumented) {
  CLI::App app{"test daemon"};
  DaemonMain daemon("granary-test", app);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(daemon.Usage("--node-id: bad"), kDaemonExitUsage);
  EXPECT_EQ(daemon.BadConfig(Status::InvalidArgument("/etc/x.yaml:3: unknown key 'a'")),
            kDaemonExitUsage);
  EXPECT_EQ(daemon.StartFailed(Status::Unavailable("the store is down")), kDaemonExitRuntime);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("granary-test: --node-id: bad\n"));
  EXPECT_THAT(err, HasSubstr("granary-test: /etc/x.yaml:3: unknown key 'a'\n"));
  EXPECT_THAT(err, HasSubstr("granary-test: "));
  EXPECT_THAT(err, HasSubstr("the store is down"));
}

// In a thread of its own, so the test's main thread keeps its signal mask.
TEST(DaemonMainTest, SignalsIgnoreSigpipeBlockStopSignalsAndWaitForOne) {
  struct sigaction before {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &before), 0);
  std::string stopped_by;
  bool blocked_here = false;
  bool blocked_in_child = false;
  std::thread daemon_main([&] {
    CLI::App app{"test daemon"};
    DaemonMain daemon("granary-test", app);
    daemon.PrepareSignals();
    sigset_t mask;
    pthread_sigmask(SIG_SETMASK, nullptr, &mask);
    blocked_here = sigismember(&mask, SIGTERM) == 1 && sigismember(&mask, SIGINT) == 1;
    // A thread the daemon starts afterwards inherits the mask.
    std::thread started([&] {
      sigset_t child;
      pthread_sigmask(SIG_SETMASK, nullptr, &child);
      blocked_in_child = sigismember(&child, SIGTERM) == 1 && sigismember(&child, SIGINT) == 1;
    });
    started.join();
    // Pending for this thread only (it is blocked), until sigwait takes it.
    pthread_kill(pthread_self(), SIGTERM);
    stopped_by = std::string(daemon.WaitForStop("daemon-main-test"));
  });
  daemon_main.join();
  struct sigaction pipe {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &pipe), 0);
  EXPECT_EQ(pipe.sa_handler, SIG_IGN);
  ::sigaction(SIGPIPE, &before, nullptr);
  EXPECT_TRUE(blocked_here);
  EXPECT_TRUE(blocked_in_child);
  EXPECT_EQ(stopped_by, "SIGTERM");
}

}  // namespace
}  // namespace granary
