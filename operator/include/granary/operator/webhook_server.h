#pragma once

// The webhook's HTTPS endpoint: POST /mutate takes an AdmissionReview v1 and
// answers with one (webhook_patch.h builds the patch). Boost.Beast and
// OpenSSL stay inside webhook_server.cc. The Dataset/CachePool lookup is a
// callback, so the server is testable without an API server; granary-operator
// would give it one that reads its informers' caches.
// docs/kubernetes-webhook.md.
//
// Thread safety: Start/Stop/port from one thread; SetCertificate and
// has_certificate from any thread. Requests are served on the
// server's own thread, which calls the lookup: it must be thread-safe
// against the caller's other threads.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "granary/core/status.h"
#include "granary/operator/webhook_patch.h"

namespace granary::kube {

// What the webhook needs to inject for Dataset `name` in namespace `ns`.
// kNotFound (or any error): the pod is refused with the status's message.
using InjectionLookup =
    std::function<Result<InjectionInputs>(const std::string& ns, const std::string& name)>;

// One POST /mutate body in, one HTTP status and body out (pure apart from
// the lookup). 400 for a body that is not a usable AdmissionReview; 200 with
// an AdmissionReview otherwise: allowed (with a JSONPatch when injecting),
// or allowed=false with the lookup's or the patch builder's message.
struct MutateReply {
  int http_status = 200;
  std::string body;
  std::string content_type = "application/json";
  // What became of the request, for logs and metrics: "injected", "skipped"
  // (not selected, an UPDATE, already injected), "refused" (the pod names a
  // Dataset it may not use, with `message`), "lookup_error" (the Dataset could
  // not be looked up: the API server unreachable, with `message`),
  // "bad_request" (not a usable AdmissionReview or pod, with `message`),
  // "error" (the lookup threw).
  std::string outcome = "skipped";
  std::string message;  // the refusal's or error's text; the pod as ns/name
  std::string pod;      // "<namespace>/<name or generateName*>", when known
};
MutateReply HandleMutate(std::string_view body, const std::string& operator_namespace,
                         const InjectionLookup& lookup);

struct WebhookServerOptions {
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: any free port (see WebhookServer::port)
  // Serving certificate (chain) and key, PEM. Both empty: none yet (every
  // connection is closed at once until SetCertificate gives one).
  std::string cert_pem;
  std::string key_pem;
  std::string operator_namespace;
  size_t max_body_bytes = kMaxReviewBytes;
  // A connection that has not finished its TLS handshake, sent a whole
  // request or taken a response within this is closed.
  std::chrono::milliseconds io_timeout{10000};
  // Connections at once; more are closed on accept.
  size_t max_connections = 64;
  // Called on the server's thread after each /mutate request (logs and
  // metrics; must not block).
  std::function<void(const MutateReply&)> on_reply;
};

class WebhookServer {
 public:
  // Binds, loads the certificate and starts serving on its own thread.
  // kInvalidArgument for a bad certificate or key; kUnavailable when the
  // address cannot be bound.
  static Result<std::unique_ptr<WebhookServer>> Start(WebhookServerOptions options,
                                                      InjectionLookup lookup);
  ~WebhookServer();  // Stop()
  WebhookServer(const WebhookServer&) = delete;
  WebhookServer& operator=(const WebhookServer&) = delete;

  uint16_t port() const;  // the bound port (still known after Stop)

  // Serves with this certificate and key from the next connection on
  // (connections already open keep theirs): a renewed certificate takes
  // effect without a restart. kInvalidArgument, and the old one kept, when
  // they are not usable PEM or the key is not the certificate's.
  Status SetCertificate(const std::string& cert_pem, const std::string& key_pem);
  bool has_certificate() const;
  // Closes the listener and every connection; joins the thread.
  void Stop();

  struct Impl;

 private:
  explicit WebhookServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace granary::kube
