#include "granary/operator/leader_election.h"

#include <ctime>

#include "granary/core/log.h"
#include "granary/core/thread_name.h"

namespace granary::kube {

LeaderElector::LeaderElector(KubeClient& client, LeaderElectionOptions options,
                             std::function<void()> on_started, std::function<void()> on_stopped)
    : client_(client),
      options_(std::move(options)),
      on_started_(std::move(on_started)),
      on_stopped_(std::move(on_stopped)) {}

LeaderElector::~LeaderElector() { Stop(); }

void LeaderElector::Start() {
  stop_ = false;
  thread_ = std::thread([this] {
    NameThisThread("leader-elect");
    Run();
  });
}

void LeaderElector::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::string LeaderElector::MicroTime(std::chrono::system_clock::time_point t) {
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(us % 1000000));
  return buf;
}

Result<bool> LeaderElector::TryAcquireOrRenew() {
  const std::string path = "/apis/coordination.k8s.io/v1/namespaces/" + options_.lease_namespace +
                           "/leases/" + options_.lease_name;
  const std::string now = MicroTime(std::chrono::system_clock::now());
  const int duration_s = static_cast<int>(
      std::chrono::duration_cast<std::chrono::seconds>(options_.lease_duration).count());
  Result<Json> current = client_.Get(path);
  if (!current.ok() && current.status().code() != StatusCode::kNotFound) return current.status();
  if (!current.ok()) {
    Json lease = {
        {"apiVersion", "coordination.k8s.io/v1"},
        {"kind", "Lease"},
        {"metadata", {{"name", options_.lease_name}, {"namespace", options_.lease_namespace}}},
        {"spec",
         {{"holderIdentity", options_.identity},
          {"leaseDurationSeconds", duration_s},
          {"acquireTime", now},
          {"renewTime", now},
          {"leaseTransitions", 0}}}};
    Result<Json> created = client_.Create(
        "/apis/coordination.k8s.io/v1/namespaces/" + options_.lease_namespace + "/leases", lease);
    if (!created.ok()) {
      if (created.status().code() == StatusCode::kAlreadyExists) return false;
      return created.status();
    }
    return true;
  }
  Json lease = *current;
  Json& spec = lease["spec"];
  const std::string holder = spec.value("holderIdentity", "");
  const std::string record = spec.dump();
  const auto steady_now = std::chrono::steady_clock::now();
  if (record != observed_record_) {
    observed_record_ = record;
    observed_at_ = steady_now;
  }
  const int held_for_s = spec.value("leaseDurationSeconds", duration_s);
  const bool expired =
      holder.empty() || steady_now - observed_at_ > std::chrono::seconds(held_for_s);
  if (holder != options_.identity && !expired) return false;
  if (holder != options_.identity) {
    spec["acquireTime"] = now;
    spec["leaseTransitions"] = spec.value("leaseTransitions", 0) + 1;
  }
  spec["holderIdentity"] = options_.identity;
  spec["leaseDurationSeconds"] = duration_s;
  spec["renewTime"] = now;
  // The resourceVersion in metadata makes this a compare-and-set.
  Result<Json> updated = client_.Replace(path, lease);
  if (!updated.ok()) {
    if (updated.status().code() == StatusCode::kFailedPrecondition) return false;
    return updated.status();
  }
  observed_record_ = (*updated)["spec"].dump();
  observed_at_ = steady_now;
  return true;
}

void LeaderElector::Release() {
  const std::string path = "/apis/coordination.k8s.io/v1/namespaces/" + options_.lease_namespace +
                           "/leases/" + options_.lease_name;
  Result<Json> current = client_.Get(path);
  if (!current.ok() || (*current)["spec"].value("holderIdentity", "") != options_.identity) return;
  Json lease = *current;
  lease["spec"]["holderIdentity"] = "";
  lease["spec"]["leaseDurationSeconds"] = 1;
  lease["spec"]["renewTime"] = MicroTime(std::chrono::system_clock::now());
  (void)client_.Replace(path, lease);
}

void LeaderElector::Run() {
  auto log = GetLogger("operator");
  while (!stop_) {
    Result<bool> held = TryAcquireOrRenew();
    const auto now = std::chrono::steady_clock::now();
    if (held.ok() && *held) {
      last_renew_ = now;
      if (!leader_.exchange(true)) {
        log->info("leader election: {} now leads (lease {}/{})", options_.identity,
                  options_.lease_namespace, options_.lease_name);
        if (on_started_) on_started_();
      }
    } else {
      if (!held.ok()) log->warn("leader election: {}", held.status().ToString());
      if (leader_.load() && (held.ok() || now - last_renew_ > options_.renew_deadline)) {
        leader_ = false;
        log->warn("leader election: {} lost the lease", options_.identity);
        if (on_stopped_) on_stopped_();
      }
    }
    const auto until = std::chrono::steady_clock::now() + options_.retry_period;
    while (!stop_ && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  if (leader_.exchange(false)) {
    Release();
    if (on_stopped_) on_stopped_();
  }
}

}  // namespace granary::kube
