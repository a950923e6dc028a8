// The cache node's memory under a flood of replies nobody reads: a real
// granary-cachenode process (tests/testing/cachenode_fixture.h) and raw sockets
// that pipeline READs of the largest size the protocol allows and never read a
// byte back.
//
// Before the reply budget, every such connection made the node hold
// max_in_flight (8) × 64 MiB: twelve of them took it from 85 MB to 4.7 GB RSS,
// and it stayed there after they closed. Now the node holds at most its reply
// budget (reply_buffer_bytes, 256 MiB by default) for all of them together, a
// well-behaved reader still gets its bytes, and the memory goes back to the
// OS when they close.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/net_address.h"
#include "granary/protocol/protocol.h"
#include "granary/protocol/protocol_format.h"
#include "testing/cachenode_fixture.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1ull << 20;

std::string Mib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f MiB", static_cast<double>(bytes) / kMiB);
  return text;
}

TEST(CacheNodeMemoryTest, UnreadRepliesAreBoundedByTheReplyBudgetAndGiveTheMemoryBack) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  ASSERT_OK((*cluster)->StartNodes(1));  // the defaults: reply_buffer_bytes 256 MiB
  DatasetOptions o;
  o.name = "flood";
  o.files = 8;
  o.min_size = 4 * kMiB;
  o.max_size = 4 * kMiB;
  o.chunk_size = 8 * kMiB;
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  CacheNode& node = (*cluster)->node(0);
  const pid_t pid = node.process()->pid();

  // One READ of max_read_bytes: 16 whole samples of 4 MiB.
  const uint64_t max_read = protocol_format::kDefaultMaxReadBytes;
  ReadRequest request;
  request.dataset = ds->name;
  request.manifest_id = ds->manifest_id;
  for (uint64_t bytes = 0; bytes + 4 * kMiB <= max_read; bytes += 4 * kMiB) {
    const auto id = static_cast<uint32_t>(request.items.size() % ds->sample_count());
    request.items.push_back(
        {ReadKind::kSample, id, 0, static_cast<uint32_t>(ds->contents[id].size())});
  }
  ASSERT_EQ(request.items.size(), 16u);
  HelloRequest hello;
  hello.peer_name = "flood";
  auto hello_frame = EncodeRequest(1, hello);
  ASSERT_OK(hello_frame);
  std::string flood = *hello_frame;
  constexpr int kPipelined = 8;  // max_in_flight
  for (int i = 0; i < kPipelined; ++i) {
    auto frame = EncodeRequest(static_cast<uint64_t>(2 + i), request);
    ASSERT_OK(frame);
    flood += *frame;
  }

  // The node at rest, after one read so that its loops and pool have run.
  DatasetReader reader(&(*cluster)->store(), *ds, 20s);
  {
    auto warm = reader.Read({0});
    ASSERT_OK(warm[0].status);
  }
  std::this_thread::sleep_for(500ms);
  const uint64_t rss_start = RssBytes(pid);
  ASSERT_GT(rss_start, 0u);

  // The budget (the default) plus a margin for what is not reply bytes: the
  // kernel-facing buffers, the pool's segment reads in progress, allocator
  // slack; under ASan also its shadow memory and the quarantine (256 MiB of
  // freed blocks kept). Old code: 12 × 8 × 64 MiB asked, no bound.
  const uint64_t budget = 256 * kMiB;
  const uint64_t margin = (kAsanBuild ? 512 : 128) * kMiB;
  const uint64_t rss_bound = rss_start + budget + margin;

  constexpr int kFlooders = 12;
  std::vector<ScopedFd> flooders;
  for (int i = 0; i < kFlooders; ++i) {
    // Sends and never reads: a small receive buffer, so the kernel takes little.
    ScopedFd fd = ConnectLoopback(node.address(), 64 << 10);
    ASSERT_TRUE(fd.valid()) << "connection " << i << " to " << node.address();
    ASSERT_TRUE(SendAll(fd.get(), flood)) << "connection " << i;
    flooders.push_back(std::move(fd));
  }

  // A well-behaved reader on its own connection, meanwhile: correct bytes of a
  // whole sample within a bound, not starved by the flood.
  std::atomic<bool> good_done{false};
  Status good_status;
  Clock::duration good_took{};
  std::thread good([&] {
    const auto start = Clock::now();
    DatasetReader r(&(*cluster)->store(), *ds, 20s);
    auto got = r.Read({3});
    good_took = Clock::now() - start;
    if (!got[0].status.ok()) {
      good_status = got[0].status;
    } else if (got[0].bytes != ds->contents[3]) {
      good_status = Status::Corruption("sample 3 came back with wrong bytes");
    }
    good_done = true;
  });

  // RSS over 8 s of flood (or until it passes the bound: the old code would
  // go on to gigabytes).
  uint64_t rss_peak = rss_start;
  const auto flood_end = Clock::now() + 8s;
  while (Clock::now() < flood_end) {
    rss_peak = std::max(rss_peak, RssBytes(pid));
    if (rss_peak > rss_bound) break;
    std::this_thread::sleep_for(100ms);
  }
  auto waits = node.MetricValue("granary_cachenode_reply_budget_waits_total");
  auto used = node.MetricValue("granary_cachenode_reply_budget_used_bytes");

  // The flood stops: every reply it held is dropped, the memory given back.
  flooders.clear();
  good.join();
  uint64_t rss_after = RssBytes(pid);
  const uint64_t near_start = rss_start + (kAsanBuild ? 384 : 64) * kMiB;
  const auto settle_end = Clock::now() + 15s;
  while (rss_after > near_start && Clock::now() < settle_end) {
    std::this_thread::sleep_for(200ms);
    rss_after = RssBytes(pid);
  }
  std::printf(
      "flood: RSS start %s, peak %s (bound %s), after close %s; the good read took %.0f ms\n",
      Mib(rss_start).c_str(), Mib(rss_peak).c_str(), Mib(rss_bound).c_str(), Mib(rss_after).c_str(),
      std::chrono::duration<double, std::milli>(good_took).count());

  EXPECT_LE(rss_peak, rss_bound) << "the node held more than its reply budget for " << kFlooders
                                 << " connections that never read";
  EXPECT_LE(rss_after, near_start) << "the node kept the memory after the connections closed";
  ASSERT_TRUE(good_done.load());
  EXPECT_TRUE(good_status.ok())
      << "the well-behaved reader did not get its bytes during the flood: "
      << good_status.ToString();
  // reply_stall_timeout (5 s) frees the budget the flood holds; then a read.
  EXPECT_LT(good_took, kAsanBuild ? 20s : 10s)
      << "the well-behaved reader was held up by the flood";
  ASSERT_OK(waits);
  EXPECT_GT(*waits, 0) << "no READ waited for the budget: the flood did not reach it";
  ASSERT_OK(used);
  EXPECT_LE(*used, static_cast<double>(budget + 4 * kMiB));

  // And the node still serves everything right.
  auto all = reader.Read(ds->AllIds());
  for (SampleId id = 0; id < all.size(); ++id) {
    ASSERT_TRUE(all[id].status.ok()) << "sample " << id << ": " << all[id].status.ToString();
    EXPECT_EQ(all[id].bytes, ds->contents[id]) << "sample " << id;
  }
}

}  // namespace
}  // namespace granary::testing
