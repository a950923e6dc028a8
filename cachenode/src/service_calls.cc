// The service calls (service_calls.h): what a service thread runs for a
// connection of any front end: a READ or STAT through the ReadService,
// encoded for the connection's protocol version, and a Kubernetes token
// through the TokenVerifier. Either may block (disk, source, API server),
// which is why they never run on an event loop. The TCP server's pool side
// (ServerCore::RunService, server_core.h) is at the end.

#include "service_calls.h"

#include <fcntl.h>

#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <variant>

#include "granary/protocol/protocol_format.h"
#include "server_core.h"

namespace granary::server_internal {

namespace {

// A Kubernetes token through the verifier: AUTH_REPLY granted, or a closing ERROR.
ServiceResult CheckToken(const ServiceCallContext& context, const AuthRequest& auth,
                         uint64_t request_id, uint16_t version) {
  ServiceResult out;
  // PeerSession sends a token here only when a verifier is configured.
  Result<PeerIdentity> identity = context.options->auth->tokens->Verify(auth.credential);
  if (!identity.ok()) {
    Add(*context.auth_refused);
    if (context.warn)
      context.warn("a Kubernetes token was refused: " + identity.status().ToString());
    out.frame = ErrorFrame(
        request_id,
        Status(identity.status().code(), "authentication refused: " + identity.status().message()),
        true, version);
    out.close_after = true;
    return out;
  }
  Result<OutgoingFrame> frame =
      EncodeResponse(request_id, AuthReply{true, {}, {}, identity->Scope()}, {},
                     EncodeOptions{version, context.options->limits});
  if (!frame.ok()) {
    Add(*context.auth_refused);
    out.frame = ErrorFrame(request_id, frame.status(), true, version);
    out.close_after = true;
    return out;
  }
  Add(*context.auth_granted);
  out.frame = std::move(*frame);
  out.granted = std::move(*identity);
  return out;
}

}  // namespace

ServiceResult RunServiceCall(const ServiceCallContext& context, const ServiceRequest& request,
                             uint64_t request_id, uint16_t version) {
  const EncodeOptions encode{version, context.options->limits};
  ServiceResult out;
  auto error = [&](const Status& status) {
    out.frame = ErrorFrame(request_id, status, false, version);
  };
  if (const auto* auth = std::get_if<AuthRequest>(&request)) {
    return CheckToken(context, *auth, request_id, version);
  }
  if (const auto* read = std::get_if<ReadRequest>(&request)) {
    Result<ReadAnswer> answer = context.service->Read(*read);
    if (!answer.ok()) {
      Add(*context.service_errors);
      error(answer.status());
      return out;
    }
    Status check = CheckReadReply(*read, answer->reply());
    Result<OutgoingFrame> frame =
        check.ok() ? EncodeResponse(request_id, answer->reply(), answer->payload(), encode)
                   : Result<OutgoingFrame>(check);
    if (!frame.ok()) {
      Add(*context.internal_errors);
      Status internal = Status::Internal("the read service's answer to READ request " +
                                         std::to_string(request_id) +
                                         " does not match it: " + frame.status().message() +
                                         "; this is a bug in the cache node, please report it");
      context.log->error("{}", internal.message());
      error(internal);
      return out;
    }
    out.items = read->items.size();
    for (const ReadReplyItem& item : answer->reply().items) {
      if (!item.status.ok()) ++out.item_errors;
    }
    // Start reading the file ranges into the page cache here, on a thread that
    // may block, so that sendfile on the event loop finds the pages there.
    for (const PayloadPiece& piece : answer->payload()) {
      if (const auto* f = std::get_if<FileRange>(&piece)) {
        (void)::posix_fadvise(f->fd, static_cast<off_t>(f->offset), static_cast<off_t>(f->length),
                              POSIX_FADV_WILLNEED);
      }
    }
    out.frame = std::move(*frame);
    out.answer.emplace(std::move(*answer));
    return out;
  }
  const auto& stat = std::get<StatRequest>(request);
  Result<StatReply> reply = context.service->Stat(stat);
  if (!reply.ok()) {
    Add(*context.service_errors);
    error(reply.status());
    return out;
  }
  if (context.finish_stat) context.finish_stat(stat, &*reply);
  Result<OutgoingFrame> frame = EncodeResponse(request_id, *reply, {}, encode);
  if (!frame.ok()) {
    Add(*context.internal_errors);
    Status internal =
        Status::Internal("the read service's answer to STAT request " + std::to_string(request_id) +
                         " cannot be sent: " + frame.status().message() +
                         "; this is a bug in the cache node, please report it");
    context.log->error("{}", internal.message());
    error(internal);
    return out;
  }
  out.frame = std::move(*frame);
  return out;
}

void ClientWarnings::Warn(const std::string& message) {
  const auto now = std::chrono::steady_clock::now();
  uint64_t suppressed = 0;
  {
    std::lock_guard lock(mu_);
    if (now - last_ < kInterval) {
      ++suppressed_;
      log_.debug("{}", message);
      return;
    }
    last_ = now;
    suppressed = std::exchange(suppressed_, 0);
  }
  if (suppressed > 0) {
    log_.warn("{} ({} similar warnings in the last second were logged at debug)", message,
              suppressed);
  } else {
    log_.warn("{}", message);
  }
}

ServiceResult ServerCore::RunService(const ServiceRequest& request, uint64_t request_id,
                                     uint16_t version) {
  ServiceCallContext context;
  context.service = service_.get();
  context.options = &options_;
  context.log = log_.get();
  context.service_errors = &counters_.service_errors;
  context.internal_errors = &counters_.internal_errors;
  context.auth_refused = &counters_.auth_refused;
  context.auth_granted = &counters_.auth_granted;
  context.warn = [this](const std::string& message) { WarnAboutClient(message); };
  context.finish_stat = [this](const StatRequest& stat, StatReply* reply) {
    if (stat.dataset.empty()) AppendServerEntries(reply);
    if (draining()) reply->state = NodeState::kDraining;
  };
  return RunServiceCall(context, request, request_id, version);
}

void ServerCore::AppendServerEntries(StatReply* reply) const {
  const AtomicCounters& c = counters_;
  const uint64_t errors = Load(c.framing_errors) + Load(c.truncated_frames) +
                          Load(c.message_errors) + Load(c.policy_errors) + Load(c.service_errors) +
                          Load(c.internal_errors) + Load(c.timeouts) + Load(c.send_errors);
  const std::pair<const char*, uint64_t> entries[] = {
      {"server_connections_open", Load(c.connections_open)},
      {"server_connections_accepted_total", Load(c.connections_accepted)},
      {"server_requests_total", Load(c.requests)},
      {"server_read_items_total", Load(c.read_items)},
      {"server_payload_bytes_total", Load(c.payload_bytes)},
      {"server_sent_bytes_total", Load(c.sent_bytes)},
      {"server_errors_total", errors},
      {"server_buffered_bytes", Load(c.buffered_bytes)},
      {"server_reply_budget_used_bytes", budget_.used()},
      {"server_reply_budget_waits_total", Load(c.reply_budget_waits)},
  };
  for (const auto& [key, value] : entries) {
    if (reply->entries.size() >= pf::kMaxStatEntries) break;
    bool taken = std::any_of(reply->entries.begin(), reply->entries.end(),
                             [key = key](const StatEntry& e) { return e.key == key; });
    if (!taken) reply->entries.push_back(StatEntry{key, value});
  }
}

}  // namespace granary::server_internal
