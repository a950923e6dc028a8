#pragma once

// KubeClient: the Kubernetes REST API over HTTPS, for granary-operator.
// Requests are JSON in and out; the transport (Boost.Beast over OpenSSL)
// stays in kube_client.cc so that this header is cheap to include.
//
// Errors map HTTP answers onto Status codes the reconcilers can act on:
//   404 kNotFound, 409 kAlreadyExists (create) or kFailedPrecondition
//   (conflict on update), 410 kOutOfRange ("Gone": a watch's resourceVersion
//   is too old; relist), 401/403 kPermissionDenied, 400/422 kInvalidArgument,
//   429/5xx and transport failures kUnavailable, time-outs kDeadlineExceeded.
// The message carries the API server's own Status message.
//
// Thread safety: every method may be called from any number of threads; each
// request uses its own connection (the operator's request rate is low, and a
// watch holds its connection for minutes).

#include <atomic>
#include <chrono>
#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "granary/core/status.h"
#include "granary/kube/kube_config.h"

namespace granary::kube {

using Json = nlohmann::json;

struct KubeResponse {
  int status = 0;
  std::string body;
};

// What a request is to the API server: its verb (get, list, watch, create,
// update, patch, delete, deletecollection) and resource ("datasets",
// "secrets", "namespaces"; a subresource as "datasets/status"), as
// kube-apiserver's apiserver_request_total labels it.
struct RequestKind {
  std::string verb;
  std::string resource;
  auto operator<=>(const RequestKind&) const = default;
};
// The kind of `method` on `path` (a path under /api/v1 or /apis/<group>/<version>,
// with its query). A path of another shape is resource "other".
RequestKind RequestKindOf(const std::string& method, const std::string& path);

class KubeClient {
 public:
  static Result<std::unique_ptr<KubeClient>> Create(KubeConfig config);
  ~KubeClient();
  KubeClient(const KubeClient&) = delete;
  KubeClient& operator=(const KubeClient&) = delete;

  const KubeConfig& config() const { return config_; }

  // One request. `path` starts with '/' and carries the query. Transport
  // errors are a Status; any HTTP answer is a KubeResponse.
  Result<KubeResponse> Request(const std::string& method, const std::string& path,
                               const std::string& body = "",
                               const std::string& content_type = "application/json",
                               std::chrono::milliseconds timeout = std::chrono::seconds(30));

  Result<Json> Get(const std::string& path);
  Result<Json> Create(const std::string& collection_path, const Json& object);
  Result<Json> Replace(const std::string& path, const Json& object);  // PUT
  Result<Json> MergePatch(const std::string& path, const Json& patch);
  // Server-side apply: PATCH application/apply-patch+yaml (JSON is YAML),
  // fieldManager and force=true: the operator owns what it applies.
  Result<Json> Apply(const std::string& path, const Json& object, const std::string& field_manager);
  Status Delete(const std::string& path);

  // A watch: GET `path` (with watch=1 and the caller's query) and calls
  // `on_event` for each event object as it arrives. Returns OK when the
  // server ends the stream (its timeoutSeconds) or `on_event` returns false;
  // returns early (OK) once `stop` is set, within about `poll`.
  Status Watch(const std::string& path, const std::function<bool(const Json&)>& on_event,
               const std::atomic<bool>& stop,
               std::chrono::milliseconds poll = std::chrono::milliseconds(500));

  // The Status an HTTP answer means (OK for 2xx); `what` names the request.
  static Status StatusOf(const KubeResponse& response, const std::string& what);

  // Every request made so far (Request and Watch, answered or not), counted
  // by the API server's verb and resource (RequestKindOf): what the operator
  // exports as granary_operator_api_requests_total.
  std::map<RequestKind, uint64_t> RequestCounts() const;

 private:
  class Transport;
  KubeClient(KubeConfig config, std::unique_ptr<Transport> transport);
  Result<Json> JsonCall(const std::string& method, const std::string& path, const std::string& body,
                        const std::string& content_type, const std::string& what);

  void Count(const RequestKind& kind);

  KubeConfig config_;
  std::unique_ptr<Transport> transport_;
  mutable std::mutex counts_mu_;
  std::map<RequestKind, uint64_t> counts_;  // guarded by counts_mu_
};

// Percent-encodes a query parameter value.
std::string UrlEncode(const std::string& value);

}  // namespace granary::kube
