#include "testing/scripted_peer_transport.h"

#include <utility>

namespace granary::testing {

class ScriptedPeerTransport::Connection final : public PeerConnection {
 public:
  Connection(std::shared_ptr<ScriptedPeerTransport> owner, std::string address,
             std::unique_ptr<PeerConnection> real, bool verify)
      : owner_(std::move(owner)),
        address_(std::move(address)),
        real_(std::move(real)),
        verify_(verify) {}

  Result<PeerReadResult> Read(const ReadRequest& request) override {
    size_t item = 0;
    const Fault fault = owner_->NextRead(address_, &item);
    Result<PeerReadResult> result = real_->Read(request);
    if (fault == Fault::kTimeout) {
      real_->Close();  // a reply that may still come must not be taken for the next
      return Status::DeadlineExceeded("READ to cache node " + address_ +
                                      ": no reply in time (scripted)");
    }
    if (fault != Fault::kCorrupt || !result.ok() || item >= result->size()) return result;
    for (size_t i = 0; i < result->size(); ++i) {
      if (!result->status(i).ok()) return result;  // offsets of a re-check need every item
    }
    std::string payload = result->payload();
    size_t offset = 0;
    for (size_t i = 0; i < item; ++i) offset += result->reply().items[i].length;
    if (result->reply().items[item].length == 0) return result;
    payload[offset] = static_cast<char>(payload[offset] ^ 0x5a);
    return PeerReadResult::Assemble(result->reply(), std::move(payload), verify_,
                                    "READ from cache node " + address_ + " (scripted)");
  }
  Result<StatReply> Stat(const StatRequest& request) override { return real_->Stat(request); }
  Status Ping() override { return real_->Ping(); }
  void Close() override { real_->Close(); }
  bool connected() const override { return real_->connected(); }
  const ProtocolLimits& limits() const override { return real_->limits(); }

 private:
  const std::shared_ptr<ScriptedPeerTransport> owner_;
  const std::string address_;
  const std::unique_ptr<PeerConnection> real_;
  const bool verify_;
};

std::shared_ptr<ScriptedPeerTransport> ScriptedPeerTransport::Wrap(
    std::shared_ptr<PeerTransport> real) {
  return std::shared_ptr<ScriptedPeerTransport>(new ScriptedPeerTransport(std::move(real)));
}

Result<std::unique_ptr<PeerConnection>> ScriptedPeerTransport::Connect(
    std::string_view address, const PeerClientOptions& options) {
  const std::string key(address);
  {
    std::lock_guard<std::mutex> lock(mu_);
    Script& script = scripts_[key];
    if (script.refuse_connects > 0) {
      --script.refuse_connects;
      ++fired_;
      return Status::Unavailable("connect to cache node " + key + ": refused (scripted)");
    }
  }
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<PeerConnection> real, real_->Connect(address, options));
  return std::unique_ptr<PeerConnection>(std::make_unique<Connection>(
      shared_from_this(), key, std::move(real), options.verify_checksums));
}

void ScriptedPeerTransport::TimeoutRead(const std::string& address, uint64_t nth) {
  std::lock_guard<std::mutex> lock(mu_);
  scripts_[address].timeout.insert(nth);
}

void ScriptedPeerTransport::CorruptRead(const std::string& address, uint64_t nth, size_t item) {
  std::lock_guard<std::mutex> lock(mu_);
  scripts_[address].corrupt[nth] = item;
}

void ScriptedPeerTransport::RefuseConnects(const std::string& address, uint64_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  scripts_[address].refuse_connects += count;
}

uint64_t ScriptedPeerTransport::reads(const std::string& address) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = scripts_.find(address);
  return it == scripts_.end() ? 0 : it->second.reads;
}

uint64_t ScriptedPeerTransport::faults_fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

ScriptedPeerTransport::Fault ScriptedPeerTransport::NextRead(const std::string& address,
                                                             size_t* item) {
  std::lock_guard<std::mutex> lock(mu_);
  Script& script = scripts_[address];
  const uint64_t nth = ++script.reads;
  if (script.timeout.erase(nth) > 0) {
    ++fired_;
    return Fault::kTimeout;
  }
  if (auto it = script.corrupt.find(nth); it != script.corrupt.end()) {
    *item = it->second;
    script.corrupt.erase(it);
    ++fired_;
    return Fault::kCorrupt;
  }
  return Fault::kNone;
}

}  // namespace granary::testing
