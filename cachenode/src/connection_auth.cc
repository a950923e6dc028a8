#include <array>
#include <cstring>
#include <utility>
#include <variant>

#include "connection.h"
#include "granary/core/names.h"

namespace granary::server_internal {

void Connection::Handshake() {
  if (phase_ != Phase::kOpen) return;
  Result<TlsWant> want = tls_->Handshake();
  if (!want.ok()) {
    Add(server_.counters().policy_errors);
    server_.WarnAboutClient("connection " + Describe() + ": " + want.status().message() +
                            "; closed it");
    Close();
    return;
  }
  if (*want == TlsWant::kNothing) {
    tls_ready_ = true;
    Pump();
    return;
  }
  auto self = shared_from_this();
  socket_.async_wait(*want == TlsWant::kRead ? Socket::wait_read : Socket::wait_write,
                     [self](const ErrorCode& ec) {
                       if (ec) {
                         if (ec != asio::error::operation_aborted) self->Close();
                         return;
                       }
                       self->Handshake();
                     });
}

void Connection::NoteStep(uint64_t id, const SessionStep& step) {
  AtomicCounters& c = server_.counters();
  if (step.policy_error) Add(c.policy_errors);
  if (step.message_error) Add(c.message_errors);
  if (step.auth_refused) Add(c.auth_refused);
  if (step.auth_granted) Add(c.auth_granted);
  if (step.granted) OnGranted();
  if (step.refusal.ok()) return;
  if (step.warn) {
    server_.WarnAboutClient("connection " + Describe() + ": request " + std::to_string(id) + ": " +
                            step.refusal.ToString() + "; answered ERROR and closed it");
  } else {
    server_.log().debug("connection {}: request {}: {}", Describe(), id, step.refusal.ToString());
  }
}

void Connection::OnGranted() {
  server_.OnAuthenticated(*gauge_);
  server_.log().debug("connection {}: authenticated as {} ({})", Describe(),
                      session_.identity().subject, session_.identity().Scope());
}

Result<std::string> Connection::ChannelBinding() const {
  if (tls_ == nullptr) return std::string();
  Result<std::array<uint8_t, 32>> binding = tls_->ChannelBinding();
  if (!binding.ok()) return binding.status();
  return std::string(reinterpret_cast<const char*>(binding->data()), binding->size());
}

}  // namespace granary::server_internal
