// Integration tests of granary-cachenode under faults: real
// daemon processes and a real redis-server on loopback, through the fixture in
// tests/testing/cachenode_fixture.h.
//
//  - a byte flipped in a staged chunk file: detected, counted, re-staged, and
//    the reader gets the source's bytes;
//  - source files changed or deleted after the snapshot: per-item errors,
//    never bytes, the rest served;
//  - capacity a third of the dataset: used bytes never above it, the dataset
//    is Ready with the part the node keeps and says how much is resident,
//    the rest served from the source on demand and never stored;
//  - hostile sockets (random bytes, truncated frames, huge lengths, slowloris,
//    connection churn) while a well-behaved client keeps reading;
//  - a dataset owned by an unprivileged user over a file only root can read:
//    that sample fails with kPermissionDenied, the rest stage.

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "granary/core/byte_order.h"
#include "granary/core/chunk_file.h"
#include "granary/core/file.h"
#include "granary/core/names.h"
#include "granary/protocol/protocol.h"
#include "granary/protocol/protocol_format.h"
#include "testing/cachenode_fixture.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Labels = std::map<std::string, std::string>;
using Clock = std::chrono::steady_clock;

// Reads every sample once from its owner: the ids that failed (with their
// status) and those whose bytes were wrong.
struct PassResult {
  std::map<SampleId, Status> failed;
  std::vector<SampleId> wrong;
};
PassResult ReadPass(DatasetReader& reader, const TestDataset& ds) {
  PassResult r;
  const auto got = reader.Read(ds.AllIds());
  for (SampleId id = 0; id < got.size(); ++id) {
    if (!got[id].status.ok()) {
      r.failed[id] = got[id].status;
      EXPECT_TRUE(got[id].bytes.empty()) << "sample " << id << " failed but carried bytes";
    } else if (got[id].bytes != ds.contents[id]) {
      r.wrong.push_back(id);
    }
  }
  return r;
}

std::string FirstFailures(const PassResult& r) {
  std::string out;
  int n = 0;
  for (const auto& [id, s] : r.failed) {
    if (++n > 5) break;
    out += "\n  sample " + std::to_string(id) + ": " + s.ToString();
  }
  return out;
}

// ---- flipped byte ------------------------------------------------------------------

TEST(CacheNodeFaultsTest, FlippedByteInAChunkFileIsDetectedRestagedAndServedCorrectly) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  ASSERT_OK((*cluster)->StartNodes(1));
  DatasetOptions o;
  o.name = "flip";
  o.files = 400;
  o.chunk_size = 64 * 1024;
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  CacheNode& node = (*cluster)->node(0);
  ASSERT_OK(node.WaitForMetric("granary_cachenode_checksum_failures_total", {},
                               [](double v) { return v == 0; }));

  // A payload byte in the middle of a segment of the middle chunk file.
  const std::vector<std::string> files = node.ChunkFiles();
  ASSERT_EQ(files.size(), ds->manifest->chunk_count());
  const std::string& path = files[files.size() / 2];
  auto header = ChunkReader::ReadHeader(path);
  ASSERT_OK(header);
  ASSERT_EQ(header->present_count, header->segments.size()) << path;
  const ChunkSegment& seg = header->segments[header->segments.size() / 2];
  ASSERT_GT(seg.length, 0u);
  const uint64_t offset = uint64_t{header->header_region_size} + seg.chunk_offset + seg.length / 2;
  const SampleId sample = seg.sample;
  const char original = ds->contents[sample][seg.sample_offset + seg.length / 2];
  {
    auto fd = OpenFile(path, O_RDWR);
    ASSERT_OK(fd);
    char byte = 0;
    ASSERT_OK(PreadFull(fd->get(), &byte, 1, offset, path));
    ASSERT_EQ(byte, original) << "the chunk file does not hold the sample where expected";
    byte = static_cast<char>(byte ^ 0x5A);
    ASSERT_OK(PwriteFull(fd->get(), &byte, 1, offset, path));
  }

  DatasetReader reader(&(*cluster)->store(), *ds);
  auto got = reader.Read({sample});
  ASSERT_OK(got[0].status);
  EXPECT_EQ(got[0].bytes, ds->contents[sample]) << "the flipped byte was served";
  ASSERT_OK(node.WaitForMetric("granary_cachenode_checksum_failures_total", {},
                               [](double v) { return v >= 1; }));
  ASSERT_OK(node.WaitForMetric("granary_cachenode_restaged_segments_total", {},
                               [](double v) { return v >= 1; }));
  // Re-staged on disk: the file holds the source's byte again.
  EXPECT_TRUE(WaitFor(
      [&] {
        auto fd = OpenFile(path, O_RDONLY);
        char byte = 0;
        return fd.ok() && PreadFull(fd->get(), &byte, 1, offset, path).ok() && byte == original;
      },
      10s))
      << "the corrupt segment was not re-staged in " << path;

  // Served again from the repaired copy, without another checksum failure.
  const auto served_before = node.MetricValue("granary_cachenode_served_items_total");
  ASSERT_OK(served_before);
  got = reader.Read({sample});
  ASSERT_OK(got[0].status);
  EXPECT_EQ(got[0].bytes, ds->contents[sample]);
  ASSERT_OK(node.WaitForMetric("granary_cachenode_served_items_total", {},
                               [&](double v) { return v > *served_before; }));
  auto failures = node.MetricValue("granary_cachenode_checksum_failures_total");
  ASSERT_OK(failures);
  EXPECT_EQ(*failures, 1);
  const PassResult pass = ReadPass(reader, *ds);
  EXPECT_TRUE(pass.failed.empty()) << FirstFailures(pass);
  EXPECT_TRUE(pass.wrong.empty());
}

// ---- source changed after the snapshot ----------------------------------------------------

// A store that lost a node's progress (a Redis failover before it
// replicated, a store restored from an older copy): the node puts its
// unchanged progress again every progress_refresh_interval, and the dataset
// is counted staged again without a restart or a source read.
TEST(CacheNodeFaultsTest, ALostProgressRecordIsPutAgain) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  CacheNodeOptions node;
  node.extra_yaml = "progress_refresh_interval: 1s\n";
  ASSERT_OK((*cluster)->StartNodes(1, node));
  DatasetOptions o;
  o.name = "lost-progress";
  o.files = 100;
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  MetadataStore& store = (*cluster)->store();
  const std::string id = (*cluster)->node(0).id();
  auto staged = store.ListProgress(ds->name);
  ASSERT_OK(staged);
  const StagingProgress full = staged->at(id);
  ASSERT_GT(full.chunks_staged, 0u);
  // What a store that lost the last put holds: an older, emptier record.
  ASSERT_OK(store.PutProgress(ds->name, id, StagingProgress{}));
  EXPECT_TRUE(WaitFor(
      [&] {
        auto now = store.ListProgress(ds->name);
        return now.ok() && now->count(id) > 0 && now->at(id).chunks_staged == full.chunks_staged;
      },
      10s))
      << "the node did not put its progress again";
  auto record = (*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 10s);
  EXPECT_OK(record);
}

TEST(CacheNodeFaultsTest, SourceChangedAfterTheSnapshotIsAPerItemErrorNeverBytes) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  DatasetOptions o;
  o.name = "changed";
  o.files = 600;
  o.chunk_size = 64 * 1024;
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);

  // After the snapshot, before any node stages: same size with other bytes
  // (mtime moved), another size, and a deleted file.
  const SampleId same_size = 5;
  const SampleId other_size = 300;
  const SampleId deleted = 450;
  const std::string same_path = ds->PathOf(same_size);
  struct stat before {};
  ASSERT_EQ(::stat(same_path.c_str(), &before), 0);
  std::string flipped = ds->contents[same_size];
  for (char& c : flipped) c = static_cast<char>(~c);
  WriteAll(same_path, flipped);
  const timespec times[2] = {before.st_atim, {before.st_mtim.tv_sec + 1, before.st_mtim.tv_nsec}};
  ASSERT_EQ(::utimensat(AT_FDCWD, same_path.c_str(), times, 0), 0);
  WriteAll(ds->PathOf(other_size), ds->contents[other_size] + "more");
  ASSERT_EQ(::unlink(ds->PathOf(deleted).c_str()), 0);

  ASSERT_OK((*cluster)->StartNodes(1));
  // Chunks whose bad samples failed count as staged: the dataset completes.
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  auto progress = (*cluster)->store().ListProgress(ds->name);
  ASSERT_OK(progress);
  uint64_t failed = 0;
  for (const auto& [node, p] : *progress) failed += p.samples_failed;
  EXPECT_EQ(failed, 3u) << (*cluster)->Describe(ds->name);

  DatasetReader reader(&(*cluster)->store(), *ds);
  for (int pass_no = 0; pass_no < 2; ++pass_no) {  // the error sticks
    const PassResult pass = ReadPass(reader, *ds);
    EXPECT_TRUE(pass.wrong.empty()) << pass.wrong.size() << " samples with wrong bytes";
    EXPECT_EQ(pass.failed.size(), 3u) << FirstFailures(pass);
    for (SampleId id : {same_size, other_size}) {
      ASSERT_TRUE(pass.failed.contains(id)) << "sample " << id << " was served";
      EXPECT_EQ(StatusCodeName(pass.failed.at(id).code()),
                StatusCodeName(StatusCode::kFailedPrecondition))
          << pass.failed.at(id).ToString();
    }
    ASSERT_TRUE(pass.failed.contains(deleted)) << "the deleted sample was served";
  }
  CacheNode& node = (*cluster)->node(0);
  const Labels of_ds{{"dataset", ds->name}};
  EXPECT_OK(node.WaitForMetric("granary_cachenode_sample_errors", of_ds,
                               [](double v) { return v == 3; }));
  EXPECT_OK(node.WaitForMetric("granary_cachenode_source_errors_total", of_ds,
                               [](double v) { return v >= 3; }));
}

// ---- capacity ----------------------------------------------------------------------

TEST(CacheNodeFaultsTest, CapacityOfAThirdOfTheDatasetIsNeverExceededAndItIsReadyPartlyResident) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  DatasetOptions o;
  o.name = "too-big";
  o.files = 1200;
  o.chunk_size = 64 * 1024;
  // Sizes known before the node starts: the dataset is generated first, its
  // record created, and the node configured with a third of its bytes.
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  const uint64_t capacity = ds->total_bytes / 3;
  CacheNodeOptions small;
  small.capacity_bytes = capacity;
  small.source_concurrency = 2;
  CacheNode& node = (*cluster)->AddNode(small);
  ASSERT_OK(node.StartAndWaitReady());

  // Poll the used bytes (metric and heartbeat) while it stages, until the
  // dataset is Ready with what fits, and a second longer.
  double max_used = 0;
  uint64_t max_heartbeat_used = 0;
  std::string message;
  std::optional<Clock::time_point> ready_at;
  const auto deadline = Clock::now() + 60s;
  while (Clock::now() < deadline) {
    if (auto used = node.MetricValue("granary_cachenode_used_bytes"); used.ok()) {
      max_used = std::max(max_used, *used);
    }
    if (auto nodes = (*cluster)->store().ListNodes("default"); nodes.ok()) {
      for (const NodeRecord& n : *nodes) {
        max_heartbeat_used = std::max(max_heartbeat_used, n.used_bytes);
      }
    }
    if (auto record = (*cluster)->store().GetDataset(ds->name); record.ok()) {
      message = record->state.message;
      if (!ready_at && record->state.phase == DatasetPhase::kReady) ready_at = Clock::now();
    }
    if (ready_at && Clock::now() > *ready_at + 1s) break;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(ready_at.has_value())
      << "the dataset never became Ready with what fits; its "
      << "message: " << Quoted(message) << "; " << (*cluster)->Describe(ds->name);
  EXPECT_GT(max_used, 0) << "nothing was staged";
  EXPECT_LE(max_used, static_cast<double>(capacity));
  EXPECT_LE(max_heartbeat_used, capacity);
  auto capacity_gauge = node.MetricValue("granary_cachenode_capacity_bytes");
  ASSERT_OK(capacity_gauge);
  EXPECT_EQ(*capacity_gauge, static_cast<double>(capacity));
  const Labels of_ds{{"dataset", ds->name}};
  auto staged = node.MetricValue("granary_cachenode_staged_chunks", of_ds);
  ASSERT_OK(staged);
  EXPECT_GT(*staged, 0);
  EXPECT_LT(*staged, static_cast<double>(ds->manifest->chunk_count()));

  // The message agrees with the progress beside it: the percentage is what
  // the node holds of the dataset.
  auto progress = (*cluster)->store().ListProgress(ds->name);
  ASSERT_OK(progress);
  ASSERT_EQ(progress->size(), 1u);
  const StagingProgress& p = progress->begin()->second;
  EXPECT_GT(p.chunks_not_kept, 0u);
  EXPECT_EQ(p.chunks_staged, p.chunks_kept());
  const int percent = static_cast<int>(static_cast<double>(p.bytes_staged) /
                                       static_cast<double>(p.bytes_total) * 100);
  EXPECT_THAT(message, HasSubstr("Ready, " + std::to_string(percent) + "% resident (" +
                                 std::to_string(p.bytes_staged) + " of " +
                                 std::to_string(p.bytes_total) + " bytes"));
  EXPECT_THAT(message, HasSubstr("streamed from the source"));

  // Every sample is still served, the unstaged ones from the source (never
  // stored), and the store still holds no more than its capacity.
  DatasetReader reader(&(*cluster)->store(), *ds);
  const PassResult pass = ReadPass(reader, *ds);
  EXPECT_TRUE(pass.failed.empty()) << FirstFailures(pass);
  EXPECT_TRUE(pass.wrong.empty()) << pass.wrong.size() << " samples with wrong bytes";
  EXPECT_OK(node.WaitForMetric("granary_cachenode_streamed_bytes_total", of_ds,
                               [](double v) { return v > 0; }));
  auto used = node.MetricValue("granary_cachenode_used_bytes");
  ASSERT_OK(used);
  EXPECT_LE(*used, static_cast<double>(capacity));
  auto record = (*cluster)->store().GetDataset(ds->name);
  ASSERT_OK(record);
  EXPECT_EQ(record->state.phase, DatasetPhase::kReady);
}

// ---- hostile sockets ---------------------------------------------------------------

// Sends what it can; the server may close first.
void SendRaw(int fd, std::string_view bytes) { (void)SendAll(fd, bytes); }

// Reads until the server closes (true, with what it sent) or `timeout`.
bool ReadUntilClosed(int fd, std::chrono::milliseconds timeout, std::string* received = nullptr) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    pollfd pfd{fd, POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(1, left.count()))) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return true;  // reset
    }
    if (received != nullptr && received->size() < (1u << 20)) {
      received->append(buf, static_cast<size_t>(n));
    }
  }
  return false;
}

std::string HelloFrame() {
  HelloRequest hello;
  hello.peer_name = "hostile-test";
  auto bytes = EncodeRequest(1, hello);
  EXPECT_OK(bytes);
  return bytes.ok() ? *bytes : std::string();
}

// A frame header with the given type and lengths.
std::string RawHeader(uint16_t type, uint32_t body_length, uint64_t payload_length,
                      uint64_t request_id, uint16_t version = 1) {
  std::string h(protocol_format::kFrameHeaderSize, '\0');
  std::memcpy(h.data(), protocol_format::kMagic, 4);
  StoreLe<uint16_t>(h.data() + protocol_format::kVersionOffset, version);
  StoreLe<uint16_t>(h.data() + protocol_format::kTypeOffset, type);
  StoreLe<uint32_t>(h.data() + protocol_format::kBodyLengthOffset, body_length);
  StoreLe<uint64_t>(h.data() + protocol_format::kPayloadLengthOffset, payload_length);
  StoreLe<uint64_t>(h.data() + protocol_format::kRequestIdOffset, request_id);
  return h;
}

// The frames in what a server sent (decoded as responses), up to the first
// framing error.
std::vector<Frame> DecodeFrames(const std::string& bytes) {
  FrameDecoder decoder(FrameDirection::kResponses);
  std::vector<Frame> frames;
  std::string_view rest = bytes;
  while (!rest.empty()) {
    auto used = decoder.Feed(rest);
    if (!used.ok()) break;
    rest.remove_prefix(*used);
    if (decoder.has_frame()) frames.push_back(decoder.TakeFrame());
    if (*used == 0 && !decoder.has_frame()) break;
  }
  return frames;
}

TEST(CacheNodeFaultsTest, HostileSocketsDoNotDisturbAWellBehavedReader) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  ASSERT_OK((*cluster)->StartNodes(1));
  DatasetOptions o;
  o.name = "hostile";
  o.files = 800;
  o.chunk_size = 64 * 1024;
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  CacheNode& node = (*cluster)->node(0);
  const std::string address = node.address();
  const uint64_t rss_before = RssBytes(node.process()->pid());

  // The well-behaved reader: whole passes over the dataset, never retried.
  std::atomic<bool> stop{false};
  std::atomic<int> passes{0};
  std::atomic<size_t> failures{0};
  std::atomic<size_t> wrong{0};
  std::string first_failure;
  std::thread reader_thread([&] {
    DatasetReader reader(&(*cluster)->store(), *ds, 10s);
    while (!stop.load()) {
      const PassResult pass = ReadPass(reader, *ds);
      if (!pass.failed.empty() && first_failure.empty()) first_failure = FirstFailures(pass);
      failures += pass.failed.size();
      wrong += pass.wrong.size();
      ++passes;
    }
  });

  // Slowloris: frames started and dribbled a byte at a time, never finished
  // (HELLO itself, and a PING after a HELLO).
  struct Slow {
    ScopedFd fd;
    std::string frame;  // what it dribbles, all but the last byte
    size_t sent = 0;
  };
  const auto slow_start = Clock::now();
  std::vector<Slow> slow;
  const std::string hello = HelloFrame();
  for (int i = 0; i < 20; ++i) {
    Slow s;
    s.fd = ConnectLoopback(address);
    ASSERT_TRUE(s.fd.valid());
    if (i % 2 == 0) {
      s.frame = hello;
    } else {
      SendRaw(s.fd.get(), hello);
      s.frame = RawHeader(protocol_format::kTypePing, 0, 0, 2);
    }
    SendRaw(s.fd.get(), s.frame.substr(0, 5));
    s.sent = 5;
    slow.push_back(std::move(s));
  }

  // The attacks below, one round: each kind of bad client, many times.
  const auto attack_round = [&] {
    // Random bytes, with and without a HELLO first: the server closes.
    int random_closed = 0;
    for (int i = 0; i < 20; ++i) {
      ScopedFd fd = ConnectLoopback(address);
      ASSERT_TRUE(fd.valid());
      std::string junk = Bytes("junk-" + std::to_string(i), 4096);
      junk[0] = 'X';  // never the magic
      if (i % 2 == 1) SendRaw(fd.get(), hello);
      SendRaw(fd.get(), junk);
      if (ReadUntilClosed(fd.get(), 5s)) ++random_closed;
    }
    EXPECT_EQ(random_closed, 20) << "connections sending random bytes were left open";

    // Huge length fields: an ERROR, then the close; nothing allocated for them.
    for (const auto& [body, payload] : std::vector<std::pair<uint32_t, uint64_t>>{
             {0xFFFFFFFFu, 0}, {16, 1ull << 62}, {0x7FFFFFFFu, ~0ull}}) {
      ScopedFd fd = ConnectLoopback(address);
      ASSERT_TRUE(fd.valid());
      SendRaw(fd.get(), hello);
      SendRaw(fd.get(), RawHeader(protocol_format::kTypeRead, body, payload, 2));
      std::string received;
      EXPECT_TRUE(ReadUntilClosed(fd.get(), 5s, &received)) << "body " << body;
      const std::vector<Frame> frames = DecodeFrames(received);
      ASSERT_FALSE(frames.empty()) << "no reply at all to a huge length field";
      EXPECT_EQ(frames.back().header.type, protocol_format::kTypeError);
      auto error = DecodeResponse(frames.back());
      ASSERT_OK(error);
      ASSERT_TRUE(std::holds_alternative<ErrorReply>(*error));
      EXPECT_TRUE(std::get<ErrorReply>(*error).closing);
    }

    // Truncated frames: a cut header, a cut READ body, each followed by the
    // client's close (FIN, or RST).
    ReadRequest request;
    request.dataset = ds->name;
    request.manifest_id = ds->manifest_id;
    request.items = {{ReadKind::kSample, 0, 0, static_cast<uint32_t>(ds->contents[0].size())}};
    auto read_frame = EncodeRequest(2, request);
    ASSERT_OK(read_frame);
    for (int i = 0; i < 10; ++i) {
      ScopedFd fd = ConnectLoopback(address);
      ASSERT_TRUE(fd.valid());
      if (i % 2 == 0) {
        SendRaw(fd.get(), hello.substr(0, 10));
      } else {
        SendRaw(fd.get(), hello);
        SendRaw(fd.get(), read_frame->substr(0, read_frame->size() - 7));
      }
      if (i % 4 < 2) {
        ::shutdown(fd.get(), SHUT_WR);
        EXPECT_TRUE(ReadUntilClosed(fd.get(), 5s)) << "truncated frame " << i;
      } else {
        linger hard{1, 0};  // close with a reset
        ::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
      }
    }

    // A malformed request in a whole frame: an ERROR for it, and the
    // connection keeps serving (a READ of every sample of a bad dataset name,
    // then a good READ).
    {
      ScopedFd fd = ConnectLoopback(address);
      ASSERT_TRUE(fd.valid());
      SendRaw(fd.get(), hello);
      std::string bad = *read_frame;
      bad[protocol_format::kFrameHeaderSize] = 'A';  // dataset names are lowercase
      StoreLe<uint64_t>(bad.data() + protocol_format::kRequestIdOffset, 7);
      SendRaw(fd.get(), bad);
      SendRaw(fd.get(), *read_frame);
      std::string received;
      const auto deadline = Clock::now() + 10s;
      while (DecodeFrames(received).size() < 3 && Clock::now() < deadline) {
        pollfd pfd{fd.get(), POLLIN, 0};
        if (::poll(&pfd, 1, 100) != 1) continue;
        char buf[65536];
        const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
        if (n <= 0) break;
        received.append(buf, static_cast<size_t>(n));
      }
      const std::vector<Frame> frames = DecodeFrames(received);
      ASSERT_EQ(frames.size(), 3u) << "HELLO_REPLY, ERROR, READ_REPLY expected";
      EXPECT_EQ(frames[1].header.type, protocol_format::kTypeError);
      EXPECT_EQ(frames[1].header.request_id, 7u);
      EXPECT_EQ(frames[2].header.type, protocol_format::kTypeReadReply);
      EXPECT_EQ(frames[2].payload, ds->contents[0]);
    }

    // Churn: hundreds of connections opened and dropped, some with a reset,
    // then a hundred held open at once and dropped.
    for (int i = 0; i < 300; ++i) {
      ScopedFd fd = ConnectLoopback(address);
      ASSERT_TRUE(fd.valid()) << "connection " << i << " refused";
      if (i % 3 == 0) SendRaw(fd.get(), hello);
      if (i % 2 == 0) {
        linger hard{1, 0};
        ::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
      }
    }
    {
      std::vector<ScopedFd> held;
      for (int i = 0; i < 100; ++i) {
        held.push_back(ConnectLoopback(address));
        ASSERT_TRUE(held.back().valid());
      }
    }
  };

  // Attack rounds while the reader runs (it has done a pass before they
  // start), until it has done several more passes during them.
  ASSERT_TRUE(WaitFor([&] { return passes.load() >= 1; }, 30s)) << "the reader never read";
  const int passes_before_attack = passes.load();
  int rounds = 0;
  while (rounds < 2 || (passes.load() < passes_before_attack + 3 && rounds < 50)) {
    attack_round();
    ++rounds;
    if (::testing::Test::HasFatalFailure()) break;
  }
  const int passes_during_attack = passes.load() - passes_before_attack;

  // The slowloris connections are closed by the server (handshake and frame
  // timeouts), while they keep dribbling bytes.
  size_t slow_open = slow.size();
  while (slow_open > 0 && Clock::now() < slow_start + 30s) {
    slow_open = 0;
    for (Slow& s : slow) {
      if (!s.fd.valid()) continue;
      // Drain what the server sent (its closing ERROR) and see whether it closed.
      char buf[4096];
      ssize_t n = 0;
      do {
        n = ::recv(s.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
      } while (n > 0);
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        s.fd.Reset();
        continue;
      }
      ++slow_open;
      if (s.sent + 1 < s.frame.size()) {
        SendRaw(s.fd.get(), s.frame.substr(s.sent, 1));
        ++s.sent;
      }
    }
    if (slow_open > 0) std::this_thread::sleep_for(250ms);
  }
  EXPECT_EQ(slow_open, 0u) << "slowloris connections still open 30 s after they started";

  // The reader does one more whole pass after the attacks, then stops.
  const int passes_after = passes.load();
  WaitFor([&] { return passes.load() >= passes_after + 2; }, 30s);
  stop = true;
  reader_thread.join();
  EXPECT_GE(passes.load(), passes_after + 2) << "the reader stalled";
  EXPECT_GE(passes_during_attack, 3)
      << "the reader finished too few passes during " << rounds << " rounds of attacks";
  EXPECT_EQ(failures.load(), 0u) << first_failure;
  EXPECT_EQ(wrong.load(), 0u);

  // Still alive and serving; connections released; memory did not balloon.
  ASSERT_TRUE(node.Running()) << "the daemon died";
  auto health = node.Get("/healthz");
  ASSERT_OK(health);
  EXPECT_EQ(health->status, 200);
  DatasetReader reader(&(*cluster)->store(), *ds);
  const PassResult last = ReadPass(reader, *ds);
  EXPECT_TRUE(last.failed.empty()) << FirstFailures(last);
  EXPECT_TRUE(last.wrong.empty());
  EXPECT_OK(
      node.WaitForMetric("granary_cachenode_connections", {}, [](double v) { return v <= 1; }));
  const uint64_t rss_after = RssBytes(node.process()->pid());
  // ASan's quarantine holds up to 256 MiB of freed memory on top.
  constexpr uint64_t kRssGrowthLimit = kAsanBuild ? 768ull << 20 : 256ull << 20;
  EXPECT_LT(rss_after, rss_before + kRssGrowthLimit)
      << "RSS grew from " << rss_before << " to " << rss_after << " bytes";
}

// ---- permissions -------------------------------------------------------------------

TEST(CacheNodeFaultsTest, DatasetOfAnUnprivilegedOwnerCannotStageARootOnlyFile) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: the daemon must run as root to switch users";
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  // The owner (nobody) must be able to reach the tree: the temp dir is 0700.
  ASSERT_EQ(::chmod((*cluster)->dir().path().c_str(), 0711), 0);
  const uint32_t nobody = 65534;
  const SampleId secret = 123;
  std::string secret_path;
  DatasetOptions o;
  o.name = "owned";
  o.files = 400;
  o.chunk_size = 64 * 1024;
  o.owner = DatasetOwner{nobody, nobody};
  o.before_snapshot = [&](const std::string& root) {
    // Files 0644 and directories 0755 (written so), except one file only
    // root may read. Ids follow the sorted paths: d001/f000123.bin is 123.
    ASSERT_EQ(::chmod(root.c_str(), 0755), 0);
    secret_path = root + "/d001/f000123.bin";
    ASSERT_EQ(::chmod(secret_path.c_str(), 0600), 0);
  };
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_EQ(ds->PathOf(secret), secret_path);
  struct stat st {};
  ASSERT_EQ(::stat(secret_path.c_str(), &st), 0);
  ASSERT_EQ(st.st_uid, 0u);

  ASSERT_OK((*cluster)->StartNodes(1));
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  auto progress = (*cluster)->store().ListProgress(ds->name);
  ASSERT_OK(progress);
  uint64_t failed = 0;
  for (const auto& [node, p] : *progress) failed += p.samples_failed;
  EXPECT_EQ(failed, 1u) << (*cluster)->Describe(ds->name);

  DatasetReader reader(&(*cluster)->store(), *ds);
  const PassResult pass = ReadPass(reader, *ds);
  EXPECT_TRUE(pass.wrong.empty());
  ASSERT_EQ(pass.failed.size(), 1u) << FirstFailures(pass);
  ASSERT_TRUE(pass.failed.contains(secret)) << FirstFailures(pass);
  EXPECT_EQ(StatusCodeName(pass.failed.at(secret).code()),
            StatusCodeName(StatusCode::kPermissionDenied))
      << pass.failed.at(secret).ToString();
  EXPECT_OK((*cluster)->node(0).WaitForMetric(
      "granary_cachenode_sample_errors", {{"dataset", ds->name}}, [](double v) { return v == 1; }));
}

}  // namespace
}  // namespace granary::testing
