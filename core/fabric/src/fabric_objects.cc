#include "fabric_objects.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>

#include "granary/core/names.h"

namespace granary::fabric {

namespace {

constexpr uint32_t kApiVersion = FI_VERSION(1, 17);

}  // namespace

Result<InfoList> GetInfo(const std::string& provider, const char* node, const std::string& service,
                         bool source, const std::string& where) {
  if (provider.empty()) {
    return Status::InvalidArgument(where + ": no libfabric provider named: say which (tcp, verbs)");
  }
  InfoList hints(fi_allocinfo());
  if (hints.get() == nullptr) return Status::ResourceExhausted(where + ": fi_allocinfo failed");
  fi_info* h = hints.get();
  h->ep_attr->type = FI_EP_MSG;
  h->caps = FI_MSG | FI_RMA;
  h->mode = FI_CONTEXT;
  // What this code handles; the provider keeps the ones it needs.
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  h->tx_attr->msg_order = FI_ORDER_SAW;
  h->fabric_attr->prov_name = ::strdup(provider.c_str());  // freed by fi_freeinfo
  fi_info* found = nullptr;
  const int rc = fi_getinfo(kApiVersion, node, service.empty() ? nullptr : service.c_str(),
                            source ? FI_SOURCE : 0, h, &found);
  if (rc != 0 || found == nullptr) {
    return Status::Unavailable(
        where + ": libfabric offers no provider " + Quoted(provider) +
        " with connected endpoints, messages and RMA here (" + fi_strerror(-rc) +
        "); `fi_info -p " + provider +
        " -t FI_EP_MSG` lists what it has (verbs needs an RDMA device; tcp works everywhere)");
  }
  return InfoList(found);
}

Result<std::shared_ptr<FabricHandle>> OpenFabric(fi_info* info, const std::string& where) {
  auto handle = std::make_shared<FabricHandle>();
  const int rc = fi_fabric(info->fabric_attr, &handle->fabric, nullptr);
  if (rc != 0) return Status::Unavailable(where + ": fi_fabric: " + fi_strerror(-rc));
  return handle;
}

Status WaitConnected(fid_eq* eq, Deadline deadline, const std::string& where, int* provider_error) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return Status::DeadlineExceeded(where +
                                      ": not connected by the connect timeout; check "
                                      "the network and that the node serves the fabric");
    }
    uint32_t event = 0;
    fi_eq_cm_entry entry{};
    const ssize_t rc = fi_eq_sread(eq, &event, &entry, sizeof(entry),
                                   static_cast<int>(std::min<int64_t>(left.count(), 100)), 0);
    if (rc == -FI_EAGAIN || rc == -FI_ETIMEDOUT) continue;
    if (rc == -FI_EAVAIL) {
      fi_eq_err_entry err{};
      fi_eq_readerr(eq, &err, 0);
      if (provider_error != nullptr) *provider_error = err.err;
      return Status::Unavailable(where + ": " + fi_strerror(err.err) +
                                 (err.err == FI_ECONNREFUSED
                                      ? "; check that the cache node runs and serves the fabric "
                                        "at that address (its record's `fabric` label)"
                                      : ""));
    }
    if (rc < 0) {
      return Status::Unavailable(where + ": fi_eq_sread: " + fi_strerror(static_cast<int>(-rc)));
    }
    if (event == FI_CONNECTED) return Status::Ok();
    if (event == FI_SHUTDOWN) return Status::Unavailable(where + ": the peer closed at once");
  }
}

Status ProbeProvider(const std::string& provider) {
  GRANARY_ASSIGN_OR_RETURN(InfoList info,
                           GetInfo(provider, nullptr, "", false, "libfabric provider probe"));
  (void)info;
  return Status::Ok();
}

}  // namespace granary::fabric
