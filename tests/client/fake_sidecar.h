#pragma once

// FakeSidecar: a scripted sidecar for the client's unit tests
// (session_test.cc). It listens on a Unix socket, accepts one connection at a
// time and answers the sidecar protocol from a table of samples it keeps in a
// real memfd arena, so a Session can be tested against replies the real
// sidecar would never send (wrong ids, ranges outside the arena, garbage,
// silence, a closed connection, a missing descriptor). Mocks only what the
// real thing cannot produce; the Session is always the real one.
//
// Default behaviour (each overridable per request with `on_request`):
//   HELLO → HELLO_REPLY "fake-sidecar"; OPEN → OPEN_REPLY + the arena memfd;
//   GET → per id an item over its bytes (or kNotFound), plus hints: the ids
//   after the last one asked, up to `lookahead`, that the table holds;
//   SET_PLAN → OK and NEXT walks ids start_position.. in order;
//   RELEASE/PING → OK/PONG; STAT → "d/<id>.bin" entries, at most `stat_page`
//   per reply; LOOKUP → the id of "d/<id>.bin", else kNotFound; HELLO agrees
//   on the client's highest version; DIRECTORIES → the `directories` table,
//   at most `stat_page` per reply.
// Every token handed out is a pin until a release names it (pins()).
//
// Thread safety: the fake's thread serves the socket; the accessors lock.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/file.h"
#include "granary/core/status.h"
#include "granary/protocol/sidecar_protocol.h"

namespace granary::testing {

class FakeSidecar {
 public:
  // What the fake sends for one request.
  struct Action {
    std::string bytes;     // sent as is (an encoded frame, or garbage)
    bool with_fd = false;  // the arena memfd goes with the first byte
    bool close = false;    // close the connection after sending
    bool silence = false;  // send nothing; keep the connection open
  };
  using Override = std::function<std::optional<std::vector<Action>>(
      uint64_t request_id, const sidecar_protocol::Request& request)>;

  // Samples `sizes[id]` bytes each, laid out one after another in an arena of
  // `arena_bytes` (the memfd may be given `file_bytes` instead, to lie).
  FakeSidecar(std::string socket_path, std::vector<size_t> sizes, uint64_t arena_bytes = 1 << 20);
  ~FakeSidecar();
  FakeSidecar(const FakeSidecar&) = delete;
  FakeSidecar& operator=(const FakeSidecar&) = delete;

  Status Start();
  void Stop();

  const std::string& socket_path() const { return socket_path_; }
  // The bytes sample `id` holds in the arena.
  std::string BytesOf(uint32_t id) const;
  uint64_t OffsetOf(uint32_t id) const { return offsets_.at(id); }
  uint64_t arena_bytes() const { return arena_bytes_; }
  // The arena memfd (to check its seals).
  int memfd() const { return memfd_.get(); }

  void set_override(Override o);
  void set_file_bytes(uint64_t bytes) { file_bytes_ = bytes; }
  void set_stat_page(uint32_t n) { stat_page_ = n; }
  // What DIRECTORIES lists (sent as given, sorted or not). Default: "d", 0555.
  void set_directories(std::vector<sidecar_protocol::DirectoryItem> d) {
    std::lock_guard<std::mutex> lock(mu_);
    directories_ = std::move(d);
  }

  // Requests seen (after HELLO), in order.
  std::vector<sidecar_protocol::Request> requests() const;
  size_t request_count() const;
  // All tokens named by releases so far, in order.
  std::vector<uint64_t> released() const;
  // Tokens handed out and not released on the live connection.
  size_t pins() const;
  size_t connections() const { return connections_.load(); }

  // The encoded frame of a reply (a helper for overrides).
  static Action ReplyAction(uint64_t request_id, const sidecar_protocol::Reply& reply);

 private:
  void Serve();
  void ServeConnection(int fd);
  std::vector<Action> Answer(uint64_t id, const sidecar_protocol::Request& request);

  const std::string socket_path_;
  std::vector<size_t> sizes_;
  std::vector<uint64_t> offsets_;
  const uint64_t arena_bytes_;
  uint64_t file_bytes_;
  uint32_t stat_page_ = 1000;
  ScopedFd memfd_;
  char* arena_ = nullptr;
  ScopedFd listen_fd_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> connections_{0};

  mutable std::mutex mu_;  // guards the members below
  Override override_;
  std::vector<sidecar_protocol::Request> requests_;
  std::vector<uint64_t> released_;
  std::map<uint64_t, uint32_t> pins_;  // token -> id
  uint64_t next_token_ = 1;
  std::vector<uint32_t> plan_;
  std::vector<sidecar_protocol::DirectoryItem> directories_{{"d", 0555}};
  size_t plan_pos_ = 0;
};

}  // namespace granary::testing
