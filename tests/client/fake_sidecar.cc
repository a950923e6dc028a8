#include "client/fake_sidecar.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <utility>
#include <variant>

#include "granary/core/hash.h"
#include "granary/protocol/unix_socket.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

namespace sp = sidecar_protocol;

// Sends all of `bytes` on a non-blocking socket (the fd with the first byte).
bool SendAllBytes(int fd, std::string_view bytes, bool with_fd, int memfd) {
  size_t sent = 0;
  bool fd_sent = !with_fd;
  for (int round = 0; round < 100000 && sent < bytes.size(); ++round) {
    int fds[1] = {memfd};
    std::span<const int> pass = fd_sent ? std::span<const int>() : std::span<const int>(fds, 1);
    Result<size_t> n = SendWithFds(fd, bytes.substr(sent), pass);
    if (n.ok()) {
      sent += *n;
      if (*n > 0) fd_sent = true;
      continue;
    }
    if (n.status().code() != StatusCode::kUnavailable) return false;
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, 1000) < 0 && errno != EINTR) return false;
  }
  return sent == bytes.size();
}

std::string SamplePath(uint32_t id) { return "d/" + std::to_string(id) + ".bin"; }

}  // namespace

FakeSidecar::FakeSidecar(std::string socket_path, std::vector<size_t> sizes, uint64_t arena_bytes)
    : socket_path_(std::move(socket_path)),
      sizes_(std::move(sizes)),
      arena_bytes_(arena_bytes),
      file_bytes_(arena_bytes) {
  uint64_t offset = 0;
  for (size_t size : sizes_) {
    offsets_.push_back(offset);
    offset += size;
  }
}

FakeSidecar::~FakeSidecar() {
  Stop();
  if (arena_ != nullptr) ::munmap(arena_, static_cast<size_t>(file_bytes_));
}

Status FakeSidecar::Start() {
  int fd = ::memfd_create("fake-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::FromErrno(errno, "memfd_create");
  memfd_ = ScopedFd(fd);
  if (::ftruncate(fd, static_cast<off_t>(file_bytes_)) != 0) {
    return Status::FromErrno(errno, "ftruncate");
  }
  void* map =
      ::mmap(nullptr, static_cast<size_t>(file_bytes_), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return Status::FromErrno(errno, "mmap");
  arena_ = static_cast<char*>(map);
  for (uint32_t id = 0; id < sizes_.size(); ++id) {
    if (offsets_[id] + sizes_[id] > file_bytes_) break;
    const std::string bytes = BytesOf(id);
    std::memcpy(arena_ + offsets_[id], bytes.data(), bytes.size());
  }
  GRANARY_ASSIGN_OR_RETURN(listen_fd_, ListenUnix(socket_path_));
  thread_ = std::thread([this] { Serve(); });
  return Status::Ok();
}

void FakeSidecar::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::string FakeSidecar::BytesOf(uint32_t id) const {
  return Bytes("sample-" + std::to_string(id), sizes_.at(id));
}

void FakeSidecar::set_override(Override o) {
  std::lock_guard<std::mutex> lock(mu_);
  override_ = std::move(o);
}

std::vector<sp::Request> FakeSidecar::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

size_t FakeSidecar::request_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_.size();
}

std::vector<uint64_t> FakeSidecar::released() const {
  std::lock_guard<std::mutex> lock(mu_);
  return released_;
}

size_t FakeSidecar::pins() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pins_.size();
}

FakeSidecar::Action FakeSidecar::ReplyAction(uint64_t request_id, const sp::Reply& reply) {
  Result<std::string> bytes = sp::EncodeReply(request_id, reply);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return Action{bytes.ok() ? *bytes : std::string()};
}

void FakeSidecar::Serve() {
  while (!stop_) {
    pollfd p{listen_fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    Result<ScopedFd> conn = AcceptUnix(listen_fd_.get());
    if (!conn.ok()) continue;
    ++connections_;
    ServeConnection(conn->get());
    std::lock_guard<std::mutex> lock(mu_);
    pins_.clear();  // a closed connection drops its pins
  }
}

void FakeSidecar::ServeConnection(int fd) {
  sp::FrameDecoder decoder;
  std::string buffer(64 * 1024, '\0');
  while (!stop_) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    std::vector<ScopedFd> fds;
    Result<size_t> n = ReceiveWithFds(fd, std::span<char>(buffer.data(), buffer.size()), &fds);
    if (!n.ok()) {
      if (n.status().code() == StatusCode::kUnavailable) continue;
      return;
    }
    if (*n == 0) return;
    std::string_view data(buffer.data(), *n);
    while (!data.empty()) {
      Result<size_t> used = decoder.Feed(data);
      if (!used.ok()) return;
      data.remove_prefix(*used);
      if (!decoder.has_frame()) break;
      sp::Frame frame = decoder.TakeFrame();
      const uint64_t id = frame.header.request_id;
      Result<sp::Request> request = sp::DecodeRequest(frame);
      std::vector<Action> actions;
      if (!request.ok()) {
        actions.push_back(Action{sp::EncodeError(id, request.status(), true), false, true});
      } else {
        std::optional<std::vector<Action>> overridden;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (!std::holds_alternative<sp::Hello>(*request)) requests_.push_back(*request);
          if (override_) overridden = override_(id, *request);
        }
        actions = overridden ? std::move(*overridden) : Answer(id, *request);
      }
      for (const Action& a : actions) {
        if (a.silence) continue;
        if (!SendAllBytes(fd, a.bytes, a.with_fd, memfd_.get())) return;
        if (a.close) return;
      }
    }
  }
}

std::vector<FakeSidecar::Action> FakeSidecar::Answer(uint64_t id, const sp::Request& request) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto release = [&](const std::vector<uint64_t>& tokens) {
    for (uint64_t t : tokens) {
      released_.push_back(t);
      pins_.erase(t);
    }
  };
  const auto item_of = [&](uint32_t sample, bool hint) {
    sp::SampleItem item;
    item.id = sample;
    item.hint = hint;
    if (sample >= sizes_.size()) {
      item.status = Status::NotFound("fake: no sample " + std::to_string(sample));
      return item;
    }
    item.token = next_token_++;
    item.offset = offsets_[sample];
    item.length = sizes_[sample];
    item.checksum = Checksum64(BytesOf(sample));
    pins_[item.token] = sample;
    return item;
  };
  if (const auto* hello = std::get_if<sp::Hello>(&request)) {
    const auto version = std::min(hello->max_version, sp::kMaxVersion);
    return {ReplyAction(id, sp::HelloReply{version, "fake-sidecar", sp::Limits{}})};
  }
  if (std::holds_alternative<sp::Open>(request)) {
    sp::OpenReply open;
    open.manifest_id = ContentId{1, 2};
    open.sample_count = sizes_.size();
    open.total_bytes = offsets_.empty() ? 0 : offsets_.back() + sizes_.back();
    open.chunk_count = 1;
    open.arena_bytes = arena_bytes_;
    Action a = ReplyAction(id, open);
    a.with_fd = true;
    return {a};
  }
  if (const auto* get = std::get_if<sp::Get>(&request)) {
    release(get->release);
    sp::Samples samples;
    for (uint32_t sample : get->ids) samples.items.push_back(item_of(sample, false));
    if (!get->ids.empty()) {
      for (uint32_t k = 1; k <= get->lookahead; ++k) {
        const uint64_t h = uint64_t{get->ids.back()} + k;
        if (h >= sizes_.size()) break;
        samples.items.push_back(item_of(static_cast<uint32_t>(h), true));
      }
    }
    return {ReplyAction(id, samples)};
  }
  if (const auto* set = std::get_if<sp::SetPlan>(&request)) {
    plan_.clear();
    for (uint64_t s = set->start_position; s < sizes_.size(); ++s) {
      plan_.push_back(static_cast<uint32_t>(s));
    }
    plan_pos_ = 0;
    return {ReplyAction(id, sp::Ok{})};
  }
  if (const auto* next = std::get_if<sp::Next>(&request)) {
    release(next->release);
    sp::Samples samples;
    while (plan_pos_ < plan_.size() && samples.items.size() < next->max_samples) {
      samples.items.push_back(item_of(plan_[plan_pos_++], false));
    }
    samples.end_of_epoch = plan_pos_ >= plan_.size();
    return {ReplyAction(id, samples)};
  }
  if (const auto* rel = std::get_if<sp::Release>(&request)) {
    release(rel->tokens);
    return {ReplyAction(id, sp::Ok{})};
  }
  if (const auto* stat = std::get_if<sp::Stat>(&request)) {
    sp::StatReply reply;
    reply.first_id = stat->first_id;
    for (uint64_t s = stat->first_id;
         s < sizes_.size() && s < uint64_t{stat->first_id} + std::min(stat->count, stat_page_);
         ++s) {
      reply.entries.push_back(sp::StatEntry{SamplePath(static_cast<uint32_t>(s)),
                                            sizes_[static_cast<size_t>(s)], 1000});
    }
    return {ReplyAction(id, reply)};
  }
  if (const auto* lookup = std::get_if<sp::Lookup>(&request)) {
    sp::LookupReply reply;
    for (const std::string& path : lookup->paths) {
      sp::LookupItem item;
      item.status = Status::NotFound("fake: no file " + path);
      if (path.starts_with("d/") && path.ends_with(".bin")) {
        uint32_t sample = 0;
        const char* begin = path.data() + 2;
        const char* end = path.data() + path.size() - 4;
        auto [ptr, ec] = std::from_chars(begin, end, sample);
        if (ec == std::errc() && ptr == end && sample < sizes_.size()) {
          item.status = Status::Ok();
          item.id = sample;
        }
      }
      reply.items.push_back(item);
    }
    return {ReplyAction(id, reply)};
  }
  if (std::holds_alternative<sp::Ping>(request)) return {ReplyAction(id, sp::Pong{})};
  if (const auto* dirs = std::get_if<sp::Directories>(&request)) {
    sp::DirectoriesReply reply;
    reply.first = dirs->first;
    reply.total = static_cast<uint32_t>(directories_.size());
    for (uint64_t d = dirs->first;
         d < directories_.size() && d < uint64_t{dirs->first} + std::min(dirs->count, stat_page_);
         ++d) {
      reply.entries.push_back(directories_[static_cast<size_t>(d)]);
    }
    return {ReplyAction(id, reply)};
  }
  return {Action{sp::EncodeError(id, Status::InvalidArgument("fake: unexpected request"), false)}};
}

}  // namespace granary::testing
