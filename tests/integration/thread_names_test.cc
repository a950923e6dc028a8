// The daemons' threads as docs/architecture.md lists them ("Threads, and
// what each owns", one ```threads <daemon> block each): a real cache node
// (serving TCP and the fabric, with its handoff socket) and a real sidecar
// reading a dataset for a client run, and every thread of each (its name in
// /proc/<pid>/task/<tid>/comm) must be one the doc lists for that daemon.
// And the other way: every name the doc lists is given somewhere in the
// code (NameThisThread, ScopedThreadName, UnixAcceptLoopOptions::thread_name),
// and every name the code gives is in the doc.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "granary/client/session.h"
#include "testing/cachenode_fixture.h"
#include "testing/sidecar_fixture.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using namespace std::chrono_literals;

const std::string kSource = GRANARY_SOURCE_DIR;

// daemon -> the thread names the doc lists for it.
std::map<std::string, std::set<std::string>> DocumentedNames() {
  const std::string doc = testing::ReadAll(kSource + "/docs/architecture.md");
  std::map<std::string, std::set<std::string>> out;
  const std::regex block("```threads ([a-z-]+)\\n([^`]*)```");
  for (std::sregex_iterator it(doc.begin(), doc.end(), block), end; it != end; ++it) {
    std::istringstream words((*it)[2].str());
    for (std::string w; words >> w;) out[(*it)[1].str()].insert(w);
  }
  return out;
}

// The names the code gives threads, with where.
std::map<std::string, std::string> NamesInCode() {
  std::map<std::string, std::string> out;
  const std::regex given(
      R"re((?:NameThisThread\(|ScopedThreadName \w+\(|thread_name = )"([^"]*)")re");
  for (const char* top : {"cachenode", "sidecar", "daemon", "fetcher", "posix", "source", "fabric",
                          "operator", "kube", "core", "protocol", "peer", "store", "client"}) {
    const std::filesystem::path dir = std::filesystem::path(kSource) / top;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cc" && ext != ".h")) continue;
      const std::string text = testing::ReadAll(e.path().string());
      for (std::sregex_iterator it(text.begin(), text.end(), given), end; it != end; ++it) {
        out[(*it)[1].str()] = e.path().lexically_relative(kSource).string();
      }
    }
  }
  return out;
}

// tid -> name of every thread of `pid`.
std::map<std::string, std::string> ThreadsOf(pid_t pid) {
  std::map<std::string, std::string> out;
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(task, ec)) {
    // /proc files have no size: read a line, not "the whole file".
    std::ifstream comm(e.path().string() + "/comm");
    std::string name;
    std::getline(comm, name);
    out[e.path().filename().string()] = name;
  }
  return out;
}

void ExpectDocumented(const std::string& daemon, pid_t pid,
                      const std::set<std::string>& documented) {
  const auto threads = ThreadsOf(pid);
  ASSERT_GT(threads.size(), 3u) << daemon << " " << pid;
  for (const auto& [tid, name] : threads) {
    if (name == daemon.substr(0, 15)) continue;  // the main thread: the binary's name, cut
    EXPECT_TRUE(documented.count(name) != 0)
        << daemon << " thread " << tid << " is named '" << name
        << "', which docs/architecture.md does not list in ```threads " << daemon << "```";
  }
}

TEST(ThreadNamesTest, TheDocListsEveryNameTheCodeGivesAndNoOther) {
  const auto documented = DocumentedNames();
  ASSERT_TRUE(documented.count("granary-cachenode") != 0) << "no ```threads granary-cachenode";
  ASSERT_TRUE(documented.count("granary-sidecar") != 0) << "no ```threads granary-sidecar";
  ASSERT_TRUE(documented.count("granary-operator") != 0) << "no ```threads granary-operator";
  const auto in_code = NamesInCode();
  ASSERT_GT(in_code.size(), 10u);
  std::set<std::string> all;
  for (const auto& [daemon, names] : documented) all.insert(names.begin(), names.end());
  for (const auto& [name, where] : in_code) {
    EXPECT_LE(name.size(), 15u) << name << " (" << where << ") is longer than the kernel keeps";
    EXPECT_TRUE(all.count(name) != 0)
        << where << " names a thread '" << name << "' that docs/architecture.md does not list";
  }
  for (const auto& [daemon, names] : documented) {
    for (const std::string& name : names) {
      // The main thread keeps the binary's name.
      if (name == daemon) continue;
      EXPECT_TRUE(in_code.count(name) != 0) << "docs/architecture.md lists a " << daemon
                                            << " thread '" << name << "' that no code names";
    }
  }
}

TEST(ThreadNamesTest, EveryThreadOfARunningNodeAndSidecarIsOneTheDocLists) {
  const auto documented = DocumentedNames();
  auto cluster = testing::CacheCluster::Create();
  ASSERT_OK(cluster);
  testing::CacheNodeOptions node_options;
  node_options.node_id = "node-0";
  const std::string handoff = (*cluster)->dir().Join("node.sock");
  node_options.extra_yaml = "local_socket: " + handoff +
                            "\nfabric_listen: 127.0.0.1:" + std::to_string(testing::FreeTcpPort()) +
                            "\nfabric_provider: tcp\n";
  testing::CacheNode& node = (*cluster)->AddNode(node_options);
  ASSERT_OK(node.StartAndWaitReady(60s));
  testing::DatasetOptions d;
  d.name = "threads";
  d.files = 64;
  d.min_size = 256;
  d.max_size = 4096;
  d.chunk_size = 16 * 1024;
  auto ds = (*cluster)->CreateDataset(d);
  ASSERT_OK(ds);

  testing::SidecarOptions o;
  o.local_node_id = node.id();
  o.extra_yaml = "local_node_socket: " + handoff + "\n";
  auto started = testing::StartClusterSidecar(**cluster, o);
  ASSERT_OK(started);
  testing::SidecarProcess& sidecar = **started;

  // A client reads every sample: sessions, prefetch and the handoff run.
  client::SessionOptions so;
  so.socket_path = sidecar.socket_path();
  so.call_timeout = 30s;
  auto session = client::Session::Open(ds->name, so);
  ASSERT_OK(session);
  for (uint32_t i = 0; i < static_cast<uint32_t>(ds->contents.size()); ++i) {
    auto sample = (*session)->Get(i);
    ASSERT_OK(sample);
  }
  ASSERT_NE(node.process(), nullptr);
  ExpectDocumented("granary-cachenode", node.process()->pid(), documented.at("granary-cachenode"));
  ExpectDocumented("granary-sidecar", sidecar.pid(), documented.at("granary-sidecar"));
}

}  // namespace
}  // namespace granary
