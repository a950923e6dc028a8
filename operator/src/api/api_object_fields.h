#pragma once

// Reading fields of Kubernetes objects (nlohmann JSON as the API server sends
// them) without throwing: a missing field or one of another type reads as
// absent. The webhook's parts (admission_review.cc, injection_inputs.cc,
// webhook_patch.cc) share these.

#include <string>
#include <string_view>

#include "granary/kube/kube_client.h"

namespace granary::kube {

// object[key], or null when `object` is not an object or has no `key`.
inline const Json* Member(const Json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// object[key] when it is a string, else "".
inline std::string StringMember(const Json& object, const char* key) {
  const Json* v = Member(object, key);
  return v != nullptr && v->is_string() ? v->get<std::string>() : std::string();
}

// The pod's annotation `key`, or "".
inline std::string AnnotationOf(const Json& pod, std::string_view key) {
  const Json* metadata = Member(pod, "metadata");
  const Json* annotations = metadata != nullptr ? Member(*metadata, "annotations") : nullptr;
  return annotations != nullptr ? StringMember(*annotations, std::string(key).c_str()) : "";
}

}  // namespace granary::kube
