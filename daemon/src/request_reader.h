#pragma once

// RequestReader: reads the observability endpoint's requests before any worker
// sees them, for every accepted connection at once, on one thread with poll: a
// client that connects and sends half a request (or nothing) costs a
// descriptor and a buffer here, never a worker. A connection gets first_byte
// (idle_timeout) to send its first byte and whole_request (io_timeout) for the
// whole request; then it is answered 408 and closed. When max_reading
// connections are being read, the oldest is closed to make room, so a flood of
// half-sent requests cannot keep a new one (a kubelet's /healthz) out. A
// complete request goes to the worker pool (`dispatch`); if the pool's queue
// is full it waits here, still not holding a worker. Plain sockets; no
// cpp-httplib.
//
// Who calls it: ObservabilityServer (observability.cc): its accept thread
// hands sockets to Add, its workers answer what `dispatch` takes.
//
// Thread safety: Add and Stop from any thread; Stop is idempotent and also
// run by the destructor. `dispatch` runs on the reader's own thread.

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "granary/core/status.h"

namespace granary::observability {

// Requests to the endpoint are bodiless GETs; anything larger is refused.
inline constexpr size_t kMaxRequestPayloadBytes = 4096;
// The RequestReader reads at most this much of a request (cpp-httplib refuses
// request lines over 8 KiB with 414 and header lines over 8 KiB with 400).
inline constexpr size_t kMaxRequestReadBytes = 32 * 1024;

// Whether `request` is all there is to read: a request head ends at an empty
// line; a body announced by Content-Length (at most kMaxRequestPayloadBytes)
// must follow. Anything larger than kMaxRequestReadBytes, or a length that is
// not a number or too large, counts as complete: it goes to cpp-httplib as it
// is, to be refused there.
bool RequestComplete(std::string_view request);

class RequestReader {
 public:
  // Takes a complete request for a worker (then owns `sock`), or says no
  // (queue full): the reader keeps it and asks again.
  using Dispatch = std::function<bool(int sock, std::string& request)>;

  struct Limits {
    std::chrono::milliseconds first_byte{2000};
    std::chrono::milliseconds whole_request{5000};
    size_t max_reading = 1024;
  };

  // Starts the reader thread.
  static Result<std::unique_ptr<RequestReader>> Start(Limits limits, Dispatch dispatch);

  ~RequestReader();
  RequestReader(const RequestReader&) = delete;
  RequestReader& operator=(const RequestReader&) = delete;

  // Takes an accepted socket (from cpp-httplib's accept thread).
  void Add(int sock);

  // Closes every connection not yet handed to a worker; joins the thread.
  void Stop();

 private:
  using steady_clock = std::chrono::steady_clock;

  struct Conn {
    int sock = -1;
    steady_clock::time_point accepted;
    steady_clock::time_point deadline;  // first byte, then whole request
    std::string request;
    bool complete = false;  // waiting for a free place in the pool's queue
  };

  enum class Read {
    kMore,        // keep reading (or waiting for the pool's queue)
    kHandedOver,  // a worker has it
    kClosed       // the client went away or failed: close it
  };

  RequestReader(Limits limits, Dispatch dispatch)
      : limits_(limits), dispatch_(std::move(dispatch)) {}

  void Wake();
  static void Close(int sock);
  void Run();
  // Reads what has arrived.
  Read Receive(Conn& c);

  const Limits limits_;
  const Dispatch dispatch_;
  int wake_ = -1;
  std::thread thread_;
  std::mutex mu_;
  std::vector<int> incoming_;  // guarded by mu_: accepted, not yet read
  bool stopping_ = false;      // guarded by mu_
  std::vector<Conn> conns_;    // the reader thread's own
};

}  // namespace granary::observability
