#include "fabric_objects.h"

#include <dlfcn.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <iterator>

#include "granary/core/names.h"

namespace granary::fabric {

namespace {

constexpr uint32_t kApiVersion = FI_VERSION(1, 17);
constexpr char kLibrary[] = "libfabric.so.1";
// What the PSM providers' libraries take over when loaded (see the header).
constexpr int kSignalsToKeep[] = {SIGTERM, SIGINT, SIGSEGV, SIGBUS, SIGILL, SIGABRT};

Result<const FabricApi*> LoadApi() {
  struct sigaction before[std::size(kSignalsToKeep)];
  for (size_t i = 0; i < std::size(kSignalsToKeep); ++i) {
    ::sigaction(kSignalsToKeep[i], nullptr, &before[i]);
  }
  void* library = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  for (size_t i = 0; i < std::size(kSignalsToKeep); ++i) {
    ::sigaction(kSignalsToKeep[i], &before[i], nullptr);
  }
  if (library == nullptr) {
    const char* why = ::dlerror();
    return Status::Unavailable(std::string("cannot load ") + kLibrary + " (" +
                               (why != nullptr ? why : "no reason given") +
                               "): install Debian's libfabric1 to use the libfabric transport");
  }
  static FabricApi api{};
  auto symbol = [&](const char* name) -> void* { return ::dlsym(library, name); };
  api.getinfo = reinterpret_cast<decltype(api.getinfo)>(symbol("fi_getinfo"));
  api.freeinfo = reinterpret_cast<decltype(api.freeinfo)>(symbol("fi_freeinfo"));
  api.dupinfo = reinterpret_cast<decltype(api.dupinfo)>(symbol("fi_dupinfo"));
  api.fabric = reinterpret_cast<decltype(api.fabric)>(symbol("fi_fabric"));
  api.strerror = reinterpret_cast<decltype(api.strerror)>(symbol("fi_strerror"));
  if (api.getinfo == nullptr || api.freeinfo == nullptr || api.dupinfo == nullptr ||
      api.fabric == nullptr || api.strerror == nullptr) {
    return Status::Unavailable(std::string(kLibrary) +
                               " lacks fi_getinfo, fi_freeinfo, fi_dupinfo, fi_fabric or "
                               "fi_strerror: install libfabric 1.17 or newer");
  }
  // Kept loaded for the life of the process: endpoints may outlive any caller.
  return &api;
}

}  // namespace

Result<const FabricApi*> Api() {
  static const Result<const FabricApi*> loaded = LoadApi();
  return loaded;
}

std::string FabricErrorText(int err) {
  auto api = Api();
  if (!api.ok()) return "libfabric error " + std::to_string(err);
  return (*api)->strerror(err);
}

Result<InfoList> GetInfo(const std::string& provider, const char* node, const std::string& service,
                         bool source, const std::string& where) {
  if (provider.empty()) {
    return Status::InvalidArgument(where + ": no libfabric provider named: say which (tcp, verbs)");
  }
  GRANARY_ASSIGN_OR_RETURN(const FabricApi* api, Api());
  InfoList hints(api->dupinfo(nullptr));  // fi_allocinfo
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
  const int rc = api->getinfo(kApiVersion, node, service.empty() ? nullptr : service.c_str(),
                              source ? FI_SOURCE : 0, h, &found);
  if (rc != 0 || found == nullptr) {
    return Status::Unavailable(
        where + ": libfabric offers no provider " + Quoted(provider) +
        " with connected endpoints, messages and RMA here (" + FabricErrorText(-rc) +
        "); `fi_info -p " + provider +
        " -t FI_EP_MSG` lists what it has (verbs needs an RDMA device; tcp works everywhere)");
  }
  return InfoList(found);
}

Result<std::shared_ptr<FabricHandle>> OpenFabric(fi_info* info, const std::string& where) {
  auto handle = std::make_shared<FabricHandle>();
  GRANARY_ASSIGN_OR_RETURN(const FabricApi* api, Api());
  const int rc = api->fabric(info->fabric_attr, &handle->fabric, nullptr);
  if (rc != 0) return Status::Unavailable(where + ": fi_fabric: " + FabricErrorText(-rc));
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
      return Status::Unavailable(where + ": " + FabricErrorText(err.err) +
                                 (err.err == FI_ECONNREFUSED
                                      ? "; check that the cache node runs and serves the fabric "
                                        "at that address (its record's `fabric` label)"
                                      : ""));
    }
    if (rc < 0) {
      return Status::Unavailable(where +
                                 ": fi_eq_sread: " + FabricErrorText(static_cast<int>(-rc)));
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
