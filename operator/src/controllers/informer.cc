#include "granary/operator/informer.h"

#include <algorithm>
#include <set>

#include "granary/core/log.h"
#include "granary/core/thread_name.h"

namespace granary::kube {
namespace {

std::string WithQuery(const std::string& path, const std::string& query) {
  return path + (path.find('?') == std::string::npos ? "?" : "&") + query;
}

}  // namespace

Informer::Informer(KubeClient& client, InformerOptions options,
                   std::function<void(const std::string&)> on_change)
    : client_(client), options_(std::move(options)), on_change_(std::move(on_change)) {}

Informer::~Informer() { Stop(); }

void Informer::Start() {
  stop_ = false;
  thread_ = std::thread([this] {
    NameThisThread("informer");
    Run();
  });
}

void Informer::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::string Informer::KeyOf(const Json& object) {
  const Json& meta = object.value("metadata", Json::object());
  const std::string ns = meta.value("namespace", "");
  const std::string name = meta.value("name", "");
  return ns.empty() ? name : ns + "/" + name;
}

std::optional<Json> Informer::Get(const std::string& key) const {
  std::lock_guard lock(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Informer::Keys() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> keys;
  for (const auto& [k, v] : objects_) keys.push_back(k);
  return keys;
}

std::vector<Json> Informer::List() const {
  std::lock_guard lock(mu_);
  std::vector<Json> out;
  for (const auto& [k, v] : objects_) out.push_back(v);
  return out;
}

void Informer::Visit(const std::function<void(const Json&)>& visit) const {
  std::lock_guard lock(mu_);
  for (const auto& [k, v] : objects_) visit(v);
}

std::map<std::string, uint64_t> Informer::Counts() const {
  std::lock_guard lock(mu_);
  return counts_;
}

void Informer::CountLocked(const Json& object, int64_t delta) {
  if (!options_.count_by) return;
  uint64_t& n = counts_[options_.count_by(object)];
  n = static_cast<uint64_t>(static_cast<int64_t>(n) + delta);
}

void Informer::SetLocked(const std::string& key, const Json* object) {
  auto it = objects_.find(key);
  if (it != objects_.end()) {
    CountLocked(it->second, -1);
    if (object == nullptr) {
      objects_.erase(it);
      return;
    }
    it->second = *object;
  } else if (object == nullptr) {
    return;
  } else {
    it = objects_.emplace(key, *object).first;
  }
  CountLocked(it->second, +1);
}

void Informer::Sleep(std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (!stop_ && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::min(d, std::chrono::milliseconds(50)));
  }
}

Status Informer::ListAll() {
  std::string path = options_.collection_path;
  if (!options_.label_selector.empty()) {
    path = WithQuery(path, "labelSelector=" + UrlEncode(options_.label_selector));
  }
  GRANARY_ASSIGN_OR_RETURN(Json list, client_.Get(path));
  std::map<std::string, Json> fresh;
  for (const Json& item : list.value("items", Json::array())) fresh[KeyOf(item)] = item;
  std::set<std::string> changed;
  {
    std::lock_guard lock(mu_);
    for (const auto& [k, v] : objects_) {
      if (fresh.count(k) == 0) changed.insert(k);
    }
    for (const auto& [k, v] : fresh) changed.insert(k);
    objects_ = std::move(fresh);
    counts_.clear();
    for (const auto& [k, v] : objects_) CountLocked(v, +1);
  }
  resource_version_ = list["metadata"].value("resourceVersion", "");
  ++lists_;
  synced_ = true;
  last_resync_ = std::chrono::steady_clock::now();
  for (const std::string& k : changed) on_change_(k);
  return Status::Ok();
}

Status Informer::WatchOnce() {
  // The stream ends by the next resync at the latest, so resyncs happen on
  // a quiet collection too.
  const int64_t seconds = std::max<int64_t>(
      1,
      std::min<int64_t>(options_.watch_timeout.count(),
                        std::chrono::duration_cast<std::chrono::seconds>(options_.resync).count()));
  std::string query = "watch=1&allowWatchBookmarks=true&timeoutSeconds=" + std::to_string(seconds) +
                      "&resourceVersion=" + UrlEncode(resource_version_);
  if (!options_.label_selector.empty()) {
    query += "&labelSelector=" + UrlEncode(options_.label_selector);
  }
  ++watches_;
  Status gone = Status::Ok();
  Status s = client_.Watch(
      WithQuery(options_.collection_path, query),
      [&](const Json& event) {
        const std::string type = event.value("type", "");
        const Json& object = event.contains("object") ? event["object"] : Json::object();
        if (type == "ERROR") {
          const int code = object.value("code", 0);
          gone = code == 410 ? Status::OutOfRange("watch: " + object.value("message", "gone"))
                             : Status::Unavailable("watch error: " + object.value("message", ""));
          return false;
        }
        const std::string rv = object["metadata"].value("resourceVersion", "");
        if (!rv.empty()) resource_version_ = rv;
        if (type == "BOOKMARK") return true;
        const std::string key = KeyOf(object);
        {
          std::lock_guard lock(mu_);
          SetLocked(key, type == "DELETED" ? nullptr : &object);
        }
        on_change_(key);
        // Periodic resync, from the watch thread, between events.
        if (std::chrono::steady_clock::now() - last_resync_ > options_.resync) return false;
        return !stop_.load();
      },
      stop_);
  if (!gone.ok()) return gone;
  return s;
}

void Informer::Run() {
  auto log = GetLogger("operator");
  std::chrono::milliseconds backoff = options_.backoff_base;
  bool need_list = options_.start_resource_version.empty();
  resource_version_ = options_.start_resource_version;
  last_resync_ = std::chrono::steady_clock::now();
  while (!stop_) {
    Status s = Status::Ok();
    if (need_list) {
      s = ListAll();
      if (s.ok()) need_list = false;
    } else if (std::chrono::steady_clock::now() - last_resync_ > options_.resync) {
      last_resync_ = std::chrono::steady_clock::now();
      for (const std::string& k : Keys()) on_change_(k);
      continue;
    } else {
      s = WatchOnce();
      if (s.code() == StatusCode::kOutOfRange) {
        ++gone_;
        log->info("{}: resourceVersion {} is gone; listing again", options_.collection_path,
                  resource_version_);
        need_list = true;
        continue;
      }
    }
    if (s.ok()) {
      backoff = options_.backoff_base;
      continue;
    }
    if (stop_) break;
    log->warn("{}: {}; retrying in {} ms", options_.collection_path, s.ToString(), backoff.count());
    Sleep(backoff);
    backoff = std::min(options_.backoff_max, backoff * 2);
  }
}

}  // namespace granary::kube
