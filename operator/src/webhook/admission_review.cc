// The AdmissionReview v1 envelope of the sidecar-injecting webhook
// (webhook_patch.h): parsing a request body with its size and nesting
// limits, deciding whether the pod is Granary's to mutate, and writing the
// allow, patch and deny responses. The patch itself is built in
// webhook_patch.cc.
#include <string>
#include <utility>

#include "../api/api_object_fields.h"
#include "granary/kube/base64.h"
#include "granary/operator/webhook_patch.h"

namespace granary::kube {
namespace {

// Nesting depth of a JSON text, counted outside strings; stops early once
// `limit` is exceeded. nlohmann's parser is iterative, but its dump and
// several accessors recurse, so deep input is refused before parsing.
bool NestingWithin(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > limit) return false;
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return true;
}

}  // namespace

Result<AdmissionRequest> ParseAdmissionReview(std::string_view body) {
  if (body.size() > kMaxReviewBytes) {
    return Status::InvalidArgument("AdmissionReview body of " + std::to_string(body.size()) +
                                   " bytes is larger than the " + std::to_string(kMaxReviewBytes) +
                                   "-byte limit");
  }
  if (!NestingWithin(body, kMaxReviewDepth)) {
    return Status::InvalidArgument("AdmissionReview body nests deeper than " +
                                   std::to_string(kMaxReviewDepth) + " levels");
  }
  Json review = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (review.is_discarded()) {
    return Status::InvalidArgument("AdmissionReview body is not valid JSON");
  }
  if (!review.is_object()) return Status::InvalidArgument("AdmissionReview is not a JSON object");
  if (StringMember(review, "apiVersion") != "admission.k8s.io/v1" ||
      StringMember(review, "kind") != "AdmissionReview") {
    return Status::InvalidArgument(
        "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got " +
        StringMember(review, "apiVersion") + " " + StringMember(review, "kind") +
        " (register the webhook with admissionReviewVersions: [v1])");
  }
  const Json* request = Member(review, "request");
  if (request == nullptr || !request->is_object()) {
    return Status::InvalidArgument("AdmissionReview has no request object");
  }
  AdmissionRequest out;
  out.uid = StringMember(*request, "uid");
  if (out.uid.empty()) return Status::InvalidArgument("AdmissionReview request has no uid");
  out.operation = StringMember(*request, "operation");
  if (out.operation.empty()) {
    return Status::InvalidArgument("AdmissionReview request has no operation");
  }
  out.namespace_ = StringMember(*request, "namespace");
  if (out.operation == "CREATE" || out.operation == "UPDATE") {
    const Json* object = Member(*request, "object");
    if (object == nullptr || !object->is_object()) {
      return Status::InvalidArgument("AdmissionReview " + out.operation + " request has no object");
    }
    const Json* kind = Member(*request, "kind");
    const bool pod_kind = kind != nullptr && StringMember(*kind, "kind") == "Pod" &&
                          StringMember(*kind, "group").empty();
    if (!pod_kind || StringMember(*object, "kind") != "Pod") {
      return Status::InvalidArgument(
          "AdmissionReview request is not for a Pod (the webhook is registered for pods only)");
    }
    out.pod = *object;
  }
  return out;
}

InjectionDecision Decide(const AdmissionRequest& request, const std::string& operator_namespace) {
  InjectionDecision d;
  if (request.operation != "CREATE") {
    d.reason = request.operation + " is never mutated";
    return d;
  }
  if (request.namespace_ == operator_namespace) {
    d.reason = "pods in the operator's namespace are left alone";
    return d;
  }
  const Json* metadata = Member(request.pod, "metadata");
  const Json* labels = metadata != nullptr ? Member(*metadata, "labels") : nullptr;
  const Json* label =
      labels != nullptr ? Member(*labels, std::string(kDatasetLabel).c_str()) : nullptr;
  if (label == nullptr || !label->is_string() || label->get<std::string>().empty()) {
    d.reason = "no granary.io/dataset label";
    return d;
  }
  d.kind = InjectionDecision::Kind::kInject;
  d.dataset = label->get<std::string>();
  return d;
}

namespace {
Json ReviewEnvelope(const std::string& uid, Json response) {
  response["uid"] = uid;
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"response", std::move(response)}};
}

// Never throws on invalid UTF-8 (replaced with U+FFFD).
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }
}  // namespace

std::string AllowResponse(const std::string& uid) {
  return Dump(ReviewEnvelope(uid, {{"allowed", true}}));
}

std::string PatchResponse(const std::string& uid, const Json& patch) {
  if (patch.empty()) return AllowResponse(uid);
  return Dump(ReviewEnvelope(
      uid, {{"allowed", true}, {"patchType", "JSONPatch"}, {"patch", Base64Encode(Dump(patch))}}));
}

std::string DenyResponse(const std::string& uid, int code, const std::string& message) {
  return Dump(ReviewEnvelope(
      uid, {{"allowed", false}, {"status", {{"code", code}, {"message", message}}}}));
}

}  // namespace granary::kube
