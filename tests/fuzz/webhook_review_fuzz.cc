// libFuzzer target for the webhook's AdmissionReview parser and JSONPatch
// builder (operator/src/webhook/admission_review.cc, webhook_patch.cc): what the API
// server (or anyone who reaches the webhook's port) sends POST /mutate. Any
// crash, sanitizer report, uncaught exception or broken invariant is a finding.
//
// Invariants:
//  - a parsed review has a uid and an operation; CREATE/UPDATE carry a Pod;
//  - for a pod Decide() selects, BuildInjectionPatch either fails with a
//    message or returns an array of "add" operations whose paths start with
//    "/metadata/" or "/spec/", and PatchResponse/DenyResponse are JSON;
//  - the patch of an already-injected pod is empty.
// Seeds: tests/fuzz/corpus/webhook_review (a labelled pod, one with affinity,
// an UPDATE, a malformed body).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "granary/operator/webhook_patch.h"

namespace granary::kube {
namespace {

void Check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "webhook_review_fuzz: invariant broken: %s\n", what);
    std::abort();
  }
}

InjectionInputs Inputs() {
  InjectionInputs in;
  in.dataset_namespace = "team-a";
  in.dataset_name = "d";
  in.pool.name = "gpu";
  in.pool.node_selector = {{"granary.io/nvme", "true"}};
  in.pool.tolerations = Json::array({{{"key", "gpu"}, {"operator", "Exists"}}});
  in.store_secret_name = "granary-gpu-store";
  in.run_as_uid = 1000;
  in.run_as_gid = 1000;
  in.dataset_phase = "Ready";
  return in;
}

void Run(std::string_view body) {
  Result<AdmissionRequest> request = ParseAdmissionReview(body);
  if (!request.ok()) {
    Check(!request.status().message().empty(), "a refusal has a message");
    Check(!Json::parse(DenyResponse("", 400, request.status().message())).is_discarded(),
          "a deny response is JSON");
    return;
  }
  Check(!request->uid.empty() && !request->operation.empty(), "uid and operation present");
  if (request->operation == "CREATE" || request->operation == "UPDATE") {
    Check(request->pod.is_object(), "CREATE/UPDATE carry an object");
  }
  const InjectionDecision decision = Decide(*request, "granary");
  if (decision.kind != InjectionDecision::Kind::kInject) return;
  Check(request->operation == "CREATE", "only CREATE is mutated");
  InjectionInputs inputs = Inputs();
  // Further Datasets from the annotation, each "found" with the same pool
  // and identity (a different Dataset name).
  Result<std::vector<std::string>> names = NamedDatasets(request->pod, decision.dataset);
  if (!names.ok()) {
    Check(!names.status().message().empty(), "a bad datasets annotation has a message");
  } else {
    Check(!names->empty() && names->front() == decision.dataset, "the label's Dataset first");
    Check(names->size() <= kMaxDatasetsPerPod, "at most kMaxDatasetsPerPod Datasets");
    for (size_t i = 1; i < names->size(); ++i) {
      InjectionInputs other = Inputs();
      other.dataset_name = (*names)[i];
      Check(AddDataset(other, &inputs).ok(), "a Dataset of the same pool and identity is added");
    }
  }
  Result<Json> patch = BuildInjectionPatch(request->pod, inputs);
  if (!patch.ok()) {
    Check(!patch.status().message().empty(), "a bad pod has a message");
    return;
  }
  Check(patch->is_array(), "the patch is an array");
  for (const Json& op : *patch) {
    Check(op.is_object() && op.value("op", "") == "add", "only add operations");
    const std::string path = op.value("path", "");
    Check(path.rfind("/metadata/", 0) == 0 || path.rfind("/spec/", 0) == 0,
          "paths under /metadata or /spec");
  }
  Check(!Json::parse(PatchResponse(request->uid, *patch)).is_discarded(), "response is JSON");
  if (AlreadyInjected(request->pod)) Check(patch->empty(), "an injected pod gets no patch");
}

}  // namespace
}  // namespace granary::kube

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  granary::kube::Run(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
