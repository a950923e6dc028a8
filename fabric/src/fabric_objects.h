#pragma once

// libfabric's objects held the C++ way (private to fabric/): a handle
// closes its object once; the fabric is shared by a listener and the
// endpoints it accepted, so it goes last.
//
// libfabric itself is loaded when first needed (dlopen), not linked: its
// PSM providers' libraries (libinfinipath, pulled in by Debian's libfabric1)
// install handlers for SIGTERM, SIGINT, SIGSEGV, SIGBUS, SIGILL and SIGABRT
// when they are loaded, which would turn a daemon's clean stop into exit(1)
// and hide crashes in every process that links libfabric, fabric configured
// or not. Loaded lazily, only a process that uses the fabric loads it, and
// the handlers it finds before the load are put back after it. The few
// functions libfabric exports are called through Api(); everything else in
// its headers is inline, through the objects' operation tables.

#include <rdma/fabric.h>
#include <rdma/fi_eq.h>

#include <memory>
#include <string>
#include <utility>

#include "granary/fabric/endpoint.h"

namespace granary::fabric {

// Any libfabric object with a `fid` member: closed with fi_close.
template <typename T>
class Fid {
 public:
  Fid() = default;
  explicit Fid(T* object) : object_(object) {}
  Fid(Fid&& other) noexcept : object_(std::exchange(other.object_, nullptr)) {}
  Fid& operator=(Fid&& other) noexcept {
    if (this != &other) {
      Reset();
      object_ = std::exchange(other.object_, nullptr);
    }
    return *this;
  }
  ~Fid() { Reset(); }
  void Reset(T* object = nullptr) {
    if (object_ != nullptr) fi_close(&object_->fid);
    object_ = object;
  }
  T* get() const { return object_; }
  explicit operator bool() const { return object_ != nullptr; }

 private:
  T* object_ = nullptr;
};

struct FabricHandle {
  fid_fabric* fabric = nullptr;
  ~FabricHandle() {
    if (fabric != nullptr) fi_close(&fabric->fid);
  }
};

// libfabric's exported functions, from the library loaded at the first call
// (then kept). kUnavailable naming the library and the fix when it cannot be
// loaded.
struct FabricApi {
  int (*getinfo)(uint32_t, const char*, const char*, uint64_t, const fi_info*, fi_info**);
  void (*freeinfo)(fi_info*);
  fi_info* (*dupinfo)(const fi_info*);
  int (*fabric)(fi_fabric_attr*, fid_fabric**, void*);
  const char* (*strerror)(int);
};
Result<const FabricApi*> Api();

// fi_strerror's text for `err` (a positive libfabric or errno code).
std::string FabricErrorText(int err);

// An fi_info list from fi_getinfo, freed once.
class InfoList {
 public:
  explicit InfoList(fi_info* info = nullptr) : info_(info) {}
  InfoList(InfoList&& other) noexcept : info_(std::exchange(other.info_, nullptr)) {}
  InfoList& operator=(InfoList&&) = delete;
  ~InfoList() {
    if (info_ != nullptr) {
      if (auto api = Api(); api.ok()) (*api)->freeinfo(info_);
    }
  }
  fi_info* get() const { return info_; }

 private:
  fi_info* info_;
};

// Connected-endpoint info for `provider` at node:service (a listener's own
// address with `source`), with messages, RMA and send-after-write ordering.
// kUnavailable naming the provider and what to check when there is none.
Result<InfoList> GetInfo(const std::string& provider, const char* node, const std::string& service,
                         bool source, const std::string& where);

Result<std::shared_ptr<FabricHandle>> OpenFabric(fi_info* info, const std::string& where);

// Waits for FI_CONNECTED on `eq` by the deadline. When the EQ reports an
// error, `provider_error` (if given) receives its errno-style code.
Status WaitConnected(fid_eq* eq, Deadline deadline, const std::string& where,
                     int* provider_error = nullptr);

}  // namespace granary::fabric
