// KubeClient's request accounting (RequestKindOf): every path shape the
// operator uses maps to the verb and resource kube-apiserver counts it as.
// Requests against a real API server are in tests/integration/kubernetes.

#include "granary/kube/kube_client.h"

#include <gtest/gtest.h>

namespace granary::kube {
namespace {

void ExpectKind(const std::string& method, const std::string& path, const std::string& verb,
                const std::string& resource) {
  RequestKind k = RequestKindOf(method, path);
  EXPECT_EQ(k.verb, verb) << method << " " << path;
  EXPECT_EQ(k.resource, resource) << method << " " << path;
}

TEST(RequestKindTest, CoreAndGroupPathsNamespacedOrNot) {
  ExpectKind("GET", "/api/v1/namespaces/granary/secrets/granary-cluster-key", "get", "secrets");
  ExpectKind("GET", "/api/v1/namespaces/team-a", "get", "namespaces");
  ExpectKind("GET", "/api/v1/namespaces", "list", "namespaces");
  ExpectKind("GET", "/apis/granary.io/v1alpha1/datasets", "list", "datasets");
  ExpectKind("GET", "/apis/granary.io/v1alpha1/namespaces/team-a/datasets/x", "get", "datasets");
  ExpectKind("GET", "/apis/granary.io/v1alpha1/cachepools/gpu", "get", "cachepools");
  ExpectKind("GET", "/api/v1/secrets?fieldSelector=metadata.name%3Dx", "list", "secrets");
}

TEST(RequestKindTest, WatchesWritesAndSubresources) {
  ExpectKind("GET", "/apis/granary.io/v1alpha1/datasets?watch=1&allowWatchBookmarks=true", "watch",
             "datasets");
  ExpectKind("GET", "/api/v1/namespaces/g/secrets?fieldSelector=a&watch=1", "watch", "secrets");
  ExpectKind("POST", "/api/v1/namespaces/team-a/events", "create", "events");
  ExpectKind("PUT", "/apis/coordination.k8s.io/v1/namespaces/g/leases/granary-operator", "update",
             "leases");
  ExpectKind("PATCH", "/apis/granary.io/v1alpha1/namespaces/team-a/datasets/x/status", "patch",
             "datasets/status");
  ExpectKind("DELETE", "/api/v1/namespaces/team-a/secrets/granary-store-gpu", "delete", "secrets");
  ExpectKind("DELETE", "/api/v1/namespaces/team-a/secrets", "deletecollection", "secrets");
}

TEST(RequestKindTest, OtherShapesAreCountedAsOther) {
  ExpectKind("GET", "/version", "get", "other");
  ExpectKind("GET", "/healthz?verbose=1", "get", "other");
  ExpectKind("GET", "/api", "get", "other");
  ExpectKind("GET", "", "get", "other");
  ExpectKind("GET", "/apis/granary.io/v1alpha1", "get", "other");
  ExpectKind("GET", "//api//v1//namespaces", "list", "namespaces");
}

}  // namespace
}  // namespace granary::kube
