// `granary doctor [--socket S] [--config FILE]...`: checks the set-up this
// host's users and daemons depend on, each PASS, WARN or FAIL, and for every
// failure the fix (docs/cli.md, "doctor"). It reads and connects; it creates,
// changes and removes nothing (an embedded store that does not exist yet is
// not created).
//
// Kept whole at about 700 lines: its one job is the doctor's checklist. The
// checks are members of one Doctor that shares the list of results, the store
// it opened and the report; they run, and are reported, in the order they
// appear here, so the file reads as the report does.

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "cli_context.h"
#include "granary/client/session.h"
#include "granary/config/cachenode_config.h"
#include "granary/config/config_keys.h"
#include "granary/config/sidecar_config.h"
#include "granary/core/file.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "granary/fabric/endpoint.h"
#include "granary/protocol/sidecar_protocol.h"
#include "granary/protocol/unix_socket.h"
#include "granary/source/identity.h"
#include "granary/store/open_store.h"

namespace granary::cli {
namespace {

namespace sp = sidecar_protocol;

// How long each network check may take.
constexpr std::chrono::milliseconds kCheckTimeout{3000};
// A pool this full is a warning.
constexpr double kPoolFullWarning = 0.9;

enum class Verdict { kPass, kWarn, kFail };

std::string_view VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kPass:
      return "PASS";
    case Verdict::kWarn:
      return "WARN";
    case Verdict::kFail:
      return "FAIL";
  }
  return "?";
}

struct Check {
  std::string name;
  Verdict verdict = Verdict::kPass;
  std::string message;
  std::string fix;  // what to do (FAIL always has one; WARN may)
};

struct DoctorOptions {
  std::string socket;
  std::vector<std::string> configs;
};

std::string OctalMode(uint32_t mode) {
  char buffer[8];
  std::snprintf(buffer, sizeof(buffer), "%04o", mode & 07777);
  return buffer;
}

std::string FileKind(mode_t mode) {
  if (S_ISREG(mode)) return "regular file";
  if (S_ISDIR(mode)) return "directory";
  if (S_ISLNK(mode)) return "symbolic link";
  if (S_ISFIFO(mode)) return "fifo";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  return "special file";
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// "uid 1000 (alice), groups 1000 (alice), 27 (sudo)".
std::string Me() {
  const Identity me = ProcessIdentity();
  std::string s = "uid " + std::to_string(me.uid) + " (" + UserName(me.uid) + "), groups ";
  std::vector<uint32_t> groups = me.groups;
  if (std::find(groups.begin(), groups.end(), me.gid) == groups.end()) groups.push_back(me.gid);
  for (size_t i = 0; i < groups.size(); ++i) {
    s += (i == 0 ? "" : ", ") + std::to_string(groups[i]) + " (" + GroupName(groups[i]) + ")";
  }
  return s;
}

// HELLO and PING on a fresh connection: the sidecar's name.
Result<std::string> PingSidecar(const std::string& path) {
  const auto deadline = SteadyClock::now() + kCheckTimeout;
  GRANARY_ASSIGN_OR_RETURN(ScopedFd fd, ConnectUnix(path, kCheckTimeout));
  sp::Hello hello;
  hello.client_name = "granary-doctor/" + std::to_string(getpid());
  GRANARY_ASSIGN_OR_RETURN(std::string bytes, sp::EncodeRequest(1, sp::Request(hello)));
  // Sent before HELLO_REPLY says which version was agreed: as version 1, which
  // every sidecar speaks and no agreed version is below.
  GRANARY_ASSIGN_OR_RETURN(std::string ping,
                           sp::EncodeRequest(2, sp::Request(sp::Ping{}), {}, sp::kMinVersion));
  bytes += ping;
  std::string_view rest = bytes;
  while (!rest.empty()) {
    GRANARY_ASSIGN_OR_RETURN(bool ready, WaitFdReady(fd.get(), POLLOUT, deadline, "the sidecar"));
    if (!ready) return Status::DeadlineExceeded("sending HELLO and PING timed out");
    GRANARY_ASSIGN_OR_RETURN(size_t sent, SendWithFds(fd.get(), rest));
    rest.remove_prefix(sent);
  }
  sp::FrameDecoder decoder;
  std::string name;
  int replies = 0;
  char buffer[4096];
  while (replies < 2) {
    GRANARY_ASSIGN_OR_RETURN(bool ready, WaitFdReady(fd.get(), POLLIN, deadline, "the sidecar"));
    if (!ready) return Status::DeadlineExceeded("no answer to HELLO and PING within 3 s");
    GRANARY_ASSIGN_OR_RETURN(size_t n, ReceiveWithFds(fd.get(), buffer, nullptr));
    if (n == 0) return Status::Unavailable("the sidecar closed the connection");
    std::string_view data(buffer, n);
    while (!data.empty()) {
      GRANARY_ASSIGN_OR_RETURN(size_t used, decoder.Feed(data));
      data.remove_prefix(used);
      if (!decoder.has_frame()) continue;
      GRANARY_ASSIGN_OR_RETURN(sp::Reply reply, sp::DecodeReply(decoder.TakeFrame()));
      if (const auto* e = std::get_if<sp::Error>(&reply)) return e->status;
      if (const auto* h = std::get_if<sp::HelloReply>(&reply)) name = h->sidecar_name;
      ++replies;
    }
  }
  return name;
}

class Doctor {
 public:
  Doctor(CliContext& c, const DoctorOptions& o) : c_(c), o_(o) {}

  Status Run() {
    CheckStore();
    if (store_) CheckNodes();
    for (const std::string& config : o_.configs) CheckConfig(config);
    CheckSidecar();
    CheckFuse();
    return Report();
  }

 private:
  void Add(std::string name, Verdict verdict, std::string message, std::string fix = {}) {
    checks_.push_back({std::move(name), verdict, std::move(message), std::move(fix)});
  }

  // ---- the metadata store ------------------------------------------------------

  void CheckStore() {
    url_ = c_.StoreUrl();
    const bool sqlite = url_.rfind("sqlite://", 0) == 0;
    const std::string where =
        " (from " +
        std::string(!c_.store_option().empty()                ? "--store"
                    : std::getenv("GRANARY_STORE") != nullptr ? "$GRANARY_STORE"
                                                              : "the default") +
        ")";
    MetadataStoreOptions options;
    options.connect_timeout = kCheckTimeout;
    options.retry_budget = kCheckTimeout;
    // Looking at the embedded store does not create it.
    Result<std::unique_ptr<MetadataStore>> store = OpenExistingMetadataStore(url_, options);
    if (!store.ok() && sqlite && store.status().code() == StatusCode::kNotFound) {
      Add("store", Verdict::kWarn,
          url_ + where + ": the file does not exist yet; it is created on first use",
          "`granary dataset create` creates it; cache nodes and sidecars on this host must "
          "name the same file in metadata_store");
      return;
    }
    if (!store.ok()) {
      const Status& s = store.status();
      std::string fix;
      switch (s.code()) {
        case StatusCode::kInvalidArgument:
          fix =
              "write the URL as redis://host:port[/db] or sqlite:///absolute/path/granary.db "
              "in --store or GRANARY_STORE";
          break;
        case StatusCode::kUnavailable:
          fix = sqlite ? "another process holds the SQLite file locked; retry, or find it with "
                         "`fuser` on the file"
                       : "start redis-server there, or correct host:port (try `redis-cli -u " +
                             url_ + " ping`); check that no firewall is in the way";
          break;
        case StatusCode::kPermissionDenied:
          fix = sqlite ? "give yourself read and write access to the file and its directory"
                       : "put the right password in the URL: redis://:PASSWORD@host:port";
          break;
        case StatusCode::kVersionMismatch:
          fix = "run the granary version that made this store, or point --store at a new one";
          break;
        case StatusCode::kNotFound:
          fix = "create the directory, or correct the path";
          break;
        default:
          fix =
              "point --store (or GRANARY_STORE) at a Granary store; this one is not one, or "
              "is damaged";
          break;
      }
      Add("store", Verdict::kFail,
          url_ + where + ": " +
              (s.code() == StatusCode::kInvalidArgument ? "does not parse: "
               : s.code() == StatusCode::kUnavailable   ? "unreachable: "
                                                        : "cannot be opened: ") +
              s.message(),
          fix);
      return;
    }
    Result<std::vector<DatasetRecord>> datasets = (*store)->ListDatasets();
    Result<std::vector<NodeRecord>> nodes =
        datasets.ok() ? (*store)->ListNodes("")
                      : Result<std::vector<NodeRecord>>(datasets.status());
    if (!datasets.ok() || !nodes.ok()) {
      const Status s = datasets.ok() ? nodes.status() : datasets.status();
      Add("store", Verdict::kFail,
          url_ + where + ": reachable, but its records cannot be read: " + s.message(),
          "the store holds records this granary cannot read: run the matching granary "
          "version, or point --store at another store");
      return;
    }
    datasets_ = std::move(*datasets);
    nodes_ = std::move(*nodes);
    store_ = std::move(*store);
    Add("store", Verdict::kPass,
        (*store_).url() + where + ": reachable, records readable (" +
            std::to_string(datasets_.size()) + " datasets, " + std::to_string(nodes_.size()) +
            " live cache nodes)");
  }

  // ---- cache nodes ---------------------------------------------------------------

  void CheckNodes() {
    if (nodes_.empty()) {
      Add("nodes", Verdict::kFail, "no live cache node in any pool of " + url_,
          "start granary-cachenode (docs/cachenode.md) with metadata_store: " + url_ +
              " in its config; `granary doctor --config FILE` checks that file");
      return;
    }
    std::map<std::string, std::vector<const NodeRecord*>> pools;
    for (const NodeRecord& n : nodes_) pools[n.pool].push_back(&n);
    for (const auto& [pool, members] : pools) {
      uint64_t used = 0;
      uint64_t capacity = 0;
      for (const NodeRecord* n : members) {
        used += n->used_bytes;
        capacity += n->capacity_bytes;
      }
      const double fill =
          capacity > 0 ? static_cast<double>(used) / static_cast<double>(capacity) : 1.0;
      std::string message = "pool " + pool + ": " + std::to_string(members.size()) + " live node" +
                            (members.size() == 1 ? "" : "s") + ", " + HumanBytes(used) +
                            " used of " + HumanBytes(capacity);
      if (fill >= kPoolFullWarning) {
        Add("nodes", Verdict::kWarn, message + " (nearly full)",
            "add cache nodes or capacity to pool " + pool + ", or delete datasets it holds");
      } else {
        Add("nodes", Verdict::kPass, message);
      }
    }
    for (const DatasetRecord& d : datasets_) {
      if (pools.count(d.spec.pool) == 0) {
        Add("nodes", Verdict::kWarn,
            "dataset " + d.name + " is in pool " + d.spec.pool +
                ", which has no live cache node: nothing stages it and reads go to the source",
            "start granary-cachenode with pool: " + d.spec.pool);
      }
    }
  }

  // ---- the sidecar socket ----------------------------------------------------------

  void CheckSidecar() {
    std::string path = o_.socket;
    std::string from = "--socket";
    const char* env = std::getenv(std::string(client::kSocketEnvVar).c_str());
    if (path.empty() && env != nullptr && *env != '\0') {
      path = env;
      from = "$GRANARY_SOCKET";
    }
    if (path.empty() && !sidecar_socket_.empty()) {
      path = sidecar_socket_;
      from = "the sidecar config";
    }
    const bool explicit_path = !path.empty();
    if (path.empty()) {
      path = std::string(client::kDefaultSocketPath);
      from = "the default";
    }
    if (!sidecar_socket_.empty() && sidecar_socket_ != path) {
      Add("sidecar", Verdict::kWarn,
          "the sidecar config listens at " + sidecar_socket_ + ", but clients here use " + path +
              " (" + from + ")",
          "set GRANARY_SOCKET=" + sidecar_socket_ + " for the clients, or socket: " + path +
              " in the sidecar config");
    }
    const std::string what = path + " (" + from + ")";
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) {
      const int e = errno;
      if (e == ENOENT && !explicit_path) {
        Add("sidecar", Verdict::kWarn, "no sidecar socket at " + what,
            "on a training host, start granary-sidecar (docs/sidecar.md); elsewhere this is "
            "fine: `granary cat` reads from the cache nodes directly");
      } else if (e == ENOENT) {
        Add("sidecar", Verdict::kFail, "no socket at " + what,
            "start granary-sidecar with socket: " + path +
                " in its config, or point --socket / GRANARY_SOCKET at the socket it listens on");
      } else if (e == EACCES) {
        Add("sidecar", Verdict::kFail,
            "cannot look up " + what + ": a directory on the way is not searchable by you (" +
                Me() + ")",
            "let your group search " + DirectoryOf(path) +
                " (chmod g+x, and chgrp to a group "
                "of yours) or move the socket to a directory you can reach");
      } else {
        Add("sidecar", Verdict::kFail, "cannot look up " + what + ": " + std::strerror(e),
            "point --socket at the sidecar's socket");
      }
      return;
    }
    if (!S_ISSOCK(st.st_mode)) {
      Add("sidecar", Verdict::kFail, what + " is a " + FileKind(st.st_mode) + ", not a socket",
          "point --socket / GRANARY_SOCKET at the socket granary-sidecar listens on (its "
          "config's socket:); the sidecar never replaces a file that is not a socket");
      return;
    }
    const std::string owner = "owner uid " + std::to_string(st.st_uid) + " (" +
                              UserName(st.st_uid) + "), group " + std::to_string(st.st_gid) + " (" +
                              GroupName(st.st_gid) + "), mode " + OctalMode(st.st_mode);
    if (faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) != 0) {
      const std::string group = GroupName(st.st_gid);
      std::string fix;
      if ((st.st_mode & S_IWGRP) != 0) {
        fix = "add yourself to group " + group + " (`usermod -aG " + group + " " +
              UserName(geteuid()) + "`, then log in again), or run as uid " +
              std::to_string(st.st_uid);
      } else {
        fix =
            "give the socket's group write access: socket_mode: \"0660\" in the sidecar "
            "config (and run the sidecar with a group you are in, here " +
            group + " or another), then add yourself to that group; or run as uid " +
            std::to_string(st.st_uid);
      }
      Add("sidecar", Verdict::kFail,
          what + " does not let you connect (" + owner + "; you are " + Me() + ")", fix);
      return;
    }
    Result<std::string> name = PingSidecar(path);
    if (!name.ok()) {
      const Status& s = name.status();
      Add("sidecar", Verdict::kFail,
          what + " (" + owner + ") does not answer HELLO/PING: " + s.message(),
          s.code() == StatusCode::kUnavailable
              ? "start granary-sidecar (a stopped sidecar leaves its socket behind; the next "
                "start replaces it)"
              : "restart granary-sidecar and read its log; check that it is the same granary "
                "version as this CLI");
      return;
    }
    Add("sidecar", Verdict::kPass,
        what + ": sidecar " + Quoted(*name) + " answers HELLO/PING (" + owner + ")");
  }

  // ---- daemon config files -------------------------------------------------------------

  // Which daemon a config file is for, from its top-level keys; "" if unclear.
  static std::string KindOf(const std::string& text) {
    static const std::set<std::string> kCacheNode = {
        "node_id",         "listen",          "advertise",
        "data_dir",        "capacity",        "worker_threads",
        "service_threads", "max_connections", "heartbeat_interval",
        "heartbeat_ttl",   "drain_timeout",   "scan_mode",
        "scan_threads",    "local_socket"};
    static const std::set<std::string> kSidecar = {
        "socket",           "socket_mode",   "local_node",   "window_samples",     "window_bytes",
        "arena_bytes",      "fetch_threads", "fetch_batch",  "source_fallthrough", "max_clients",
        "refresh_interval", "node_down_for", "wait_timeout", "local_node_socket"};
    static const std::regex kKey("^([A-Za-z_][A-Za-z0-9_]*)\\s*:");
    int cachenode = 0;
    int sidecar = 0;
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(start, end - start);
      std::smatch m;
      if (std::regex_search(line, m, kKey)) {
        cachenode += static_cast<int>(kCacheNode.count(m[1]));
        sidecar += static_cast<int>(kSidecar.count(m[1]));
      }
      start = end + 1;
    }
    if (cachenode > sidecar) return "cachenode";
    if (sidecar > cachenode) return "sidecar";
    return "";
  }

  // Whether this user may create entries in `dir`, or, if it does not exist,
  // create it in its parent (the daemons make only the last directory: the
  // cache node its data_dir, the sidecar its socket's directory): "" when so,
  // else the problem. `*exists` says whether `dir` itself is there.
  static std::string WritableProblem(const std::string& dir, bool* exists) {
    *exists = false;
    std::string d = dir;
    struct stat st {};
    if (stat(d.c_str(), &st) == 0) {
      *exists = true;
    } else if (errno == ENOENT || errno == ENOTDIR) {
      d = DirectoryOf(dir);
      if (stat(d.c_str(), &st) != 0) {
        return "neither it nor its parent " + d + " exists (the daemon creates only " + dir +
               " itself)";
      }
    } else {
      return std::string("cannot look it up: ") + std::strerror(errno);
    }
    if (!S_ISDIR(st.st_mode)) return d + " is a " + FileKind(st.st_mode) + ", not a directory";
    if (faccessat(AT_FDCWD, d.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
      return d + " (owner uid " + std::to_string(st.st_uid) + ", mode " + OctalMode(st.st_mode) +
             ") is not writable by you";
    }
    return "";
  }

  static std::string Writable(const std::string& dir, bool exists) {
    return dir + (exists ? " is writable" : " does not exist yet and can be created");
  }

  void CheckConfig(const std::string& file) {
    const std::string name = "config";
    Result<std::string> text = ReadFileToString(file);
    if (!text.ok()) {
      Add(name, Verdict::kFail, "cannot read " + file + ": " + text.status().message(),
          "check the path and that you may read it");
      return;
    }
    const std::string kind = KindOf(*text);
    if (kind.empty()) {
      // Neither kind's keys dominate: whichever parses is the one.
      Result<CacheNodeConfig> cn = ParseCacheNodeConfig(*text, file);
      Result<sidecar::SidecarConfig> sc = sidecar::ParseSidecarConfig(*text, file);
      if (cn.ok()) return CheckCacheNodeConfig(file, *cn);
      if (sc.ok()) return CheckSidecarConfig(file, *sc);
      Add(name, Verdict::kFail,
          file +
              " is neither a valid cache node nor a valid sidecar config: " + cn.status().message(),
          "compare it with examples/cachenode.yaml or examples/sidecar.yaml");
      return;
    }
    if (kind == "cachenode") {
      Result<CacheNodeConfig> cn = ParseCacheNodeConfig(*text, file);
      if (!cn.ok()) {
        Add(name, Verdict::kFail, "cache node config " + cn.status().message(),
            "fix that line (docs/cachenode.md, \"Configuration\", lists every key; "
            "`granary-cachenode --config " +
                file + " --check` checks it too)");
        return;
      }
      return CheckCacheNodeConfig(file, *cn);
    }
    Result<sidecar::SidecarConfig> sc = sidecar::ParseSidecarConfig(*text, file);
    if (!sc.ok()) {
      Add(name, Verdict::kFail, "sidecar config " + sc.status().message(),
          "fix that line (docs/sidecar.md, \"Configuration\", lists every key; "
          "`granary-sidecar --config " +
              file + " --check` checks it too)");
      return;
    }
    CheckSidecarConfig(file, *sc);
  }

  // `store_file`: the config's metadata_store_file, read here when set.
  void CheckStoreMatches(const std::string& file, std::string config_store,
                         const std::string& store_file) {
    if (!store_file.empty()) {
      Result<std::string> url = ReadStoreUrlFile(file, store_file);
      if (!url.ok()) {
        Add("config", Verdict::kWarn, url.status().message(),
            "run doctor as the daemon's user, or check the file " + store_file);
        return;
      }
      config_store = *url;
    }
    if (config_store == url_) return;
    Add("config", Verdict::kWarn,
        file + " names metadata_store " + config_store + ", but this check used " + url_,
        "the CLI and the daemons must share one store: run `granary --store " + config_store +
            " doctor`, or set GRANARY_STORE");
  }

  void CheckCacheNodeConfig(const std::string& file, const CacheNodeConfig& config) {
    bool exists = false;
    const std::string problem = WritableProblem(config.data_dir, &exists);
    const std::string summary = "cache node config " + file + " parses (node " +
                                (config.node_id.empty() ? "<host name>" : config.node_id) +
                                ", pool " + config.pool + ", " + HumanBytes(config.capacity_bytes) +
                                ")";
    // A data_dir someone else may write lets them redirect the
    // node's writes (the node refuses it at start-up; say so here first).
    const std::string ownership =
        problem.empty() ? DataDirOwnershipProblem(config.data_dir, ::geteuid()) : "";
    if (!ownership.empty()) {
      Add("config", Verdict::kFail,
          summary + ", but its data_dir " + config.data_dir + " is unsafe: " + ownership,
          "granary-cachenode refuses it; run doctor as the user the cache node runs as (" +
              std::to_string(::geteuid()) + " now) to check it for that user");
    } else if (!problem.empty()) {
      // The daemon usually runs as root; then only root's view counts.
      Add("config", geteuid() == 0 ? Verdict::kFail : Verdict::kWarn,
          summary + ", but its data_dir " + config.data_dir + ": " + problem,
          "create " + config.data_dir +
              " (mkdir -p) owned by the user granary-cachenode runs as, mode 0700" +
              (geteuid() == 0 ? "" : " (run doctor as that user to check it for real)"));
    } else {
      Add("config", Verdict::kPass, summary + "; data_dir " + Writable(config.data_dir, exists));
    }
    if (config.fabric_listen.has_value()) {
      CheckFabricProvider(file, config.fabric_provider, "fabric_provider", "serves TCP only");
    }
    // Who may read through it: a node without authentication refuses to start.
    if (Status auth = CheckCacheNodeAuthentication(config, file); !auth.ok()) {
      Add("auth", Verdict::kFail, auth.message(),
          "set cluster_key_file (granary cluster-key generate) or kubernetes_auth");
    } else if (config.cluster_key_file.empty() && config.kubernetes_auth.empty()) {
      Add("auth", Verdict::kWarn,
          "cache node config " + file + " serves without authentication (" +
              config.listen.ToString() + "): whoever reaches it reads every dataset",
          "set cluster_key_file (granary cluster-key generate) unless every user of this "
          "machine may read every dataset");
    }
    CheckStoreMatches(file, config.metadata_store, config.metadata_store_file);
  }

  // A daemon configured for libfabric falls back to TCP when its provider is
  // not usable on this host: say so before it runs (a WARN: it still works).
  void CheckFabricProvider(const std::string& file, const std::string& provider,
                           const std::string& key, const std::string& fallback) {
    const Status usable = fabric::ProbeProvider(provider);
    if (usable.ok()) {
      Add("fabric", Verdict::kPass,
          file + ": libfabric provider " + Quoted(provider) + " is usable on this host");
      return;
    }
    Add("fabric", Verdict::kWarn,
        file + ": libfabric provider " + Quoted(provider) + " is not usable on this host (" +
            usable.message() + "); the daemon warns and " + fallback,
        "install the provider's driver and device (verbs: an RDMA NIC and its rdma-core "
        "provider), or set " +
            key + " to one `fi_info` lists (docs/transport.md)");
  }

  void CheckSidecarConfig(const std::string& file, const sidecar::SidecarConfig& config) {
    sidecar_socket_ = config.socket_path;
    const std::string dir = DirectoryOf(config.socket_path);
    bool exists = false;
    const std::string problem = WritableProblem(dir, &exists);
    const std::string summary = "sidecar config " + file + " parses (socket " + config.socket_path +
                                ", mode " + OctalMode(config.socket_mode) + ", pool " +
                                config.pool + ")";
    if (!problem.empty()) {
      Add("config", geteuid() == 0 ? Verdict::kFail : Verdict::kWarn,
          summary + ", but the socket's directory " + dir + ": " + problem,
          "create " + dir + " (mkdir -p) writable by the user granary-sidecar runs as" +
              (geteuid() == 0 ? "" : " (run doctor as that user to check it for real)"));
    } else {
      Add("config", Verdict::kPass, summary + "; its directory " + Writable(dir, exists));
    }
    if (config.transport == "libfabric") {
      CheckFabricProvider(file, config.libfabric_provider, "libfabric_provider",
                          "reads every cache node over TCP");
    }
    CheckStoreMatches(file, config.metadata_store, config.metadata_store_file);
  }

  // ---- FUSE ----------------------------------------------------------------------------

  void CheckFuse() {
    const std::string fix =
        "only `granary mount` needs it: install fuse3 (apt-get install fuse3); in a container, "
        "add --device /dev/fuse and CAP_SYS_ADMIN";
    struct stat st {};
    if (stat("/dev/fuse", &st) != 0 || !S_ISCHR(st.st_mode)) {
      Add("fuse", Verdict::kWarn, "no /dev/fuse character device", fix);
      return;
    }
    if (faccessat(AT_FDCWD, "/dev/fuse", R_OK | W_OK, AT_EACCESS) != 0) {
      Add("fuse", Verdict::kWarn,
          "/dev/fuse is not readable and writable by you (mode " + OctalMode(st.st_mode) + ")",
          fix);
      return;
    }
    const char* path_env = std::getenv("PATH");
    std::string path = path_env != nullptr ? path_env : "/usr/bin:/bin";
    std::string found;
    size_t start = 0;
    while (found.empty() && start <= path.size()) {
      size_t end = path.find(':', start);
      if (end == std::string::npos) end = path.size();
      const std::string candidate = path.substr(start, end - start) + "/fusermount3";
      if (end > start && access(candidate.c_str(), X_OK) == 0) found = candidate;
      start = end + 1;
    }
    if (found.empty()) {
      Add("fuse", Verdict::kWarn, "/dev/fuse is there, but fusermount3 is not in PATH", fix);
      return;
    }
    Add("fuse", Verdict::kPass, "/dev/fuse and " + found);
  }

  // ---- the report ----------------------------------------------------------------------

  Status Report() {
    size_t failed = 0;
    size_t warned = 0;
    for (const Check& check : checks_) {
      failed += check.verdict == Verdict::kFail ? 1 : 0;
      warned += check.verdict == Verdict::kWarn ? 1 : 0;
    }
    if (c_.json_output()) {
      Json list = Json::array();
      for (const Check& check : checks_) {
        Json j = {{"check", check.name},
                  {"status", VerdictName(check.verdict)},
                  {"message", check.message}};
        if (!check.fix.empty()) j["fix"] = check.fix;
        list.push_back(std::move(j));
      }
      c_.out() << Json{{"ok", failed == 0},
                       {"failed", failed},
                       {"warnings", warned},
                       {"store", url_},
                       {"checks", list}}
                      .dump(2)
               << "\n";
    } else {
      size_t width = 0;
      for (const Check& check : checks_) width = std::max(width, check.name.size());
      for (const Check& check : checks_) {
        c_.out() << VerdictName(check.verdict) << "  " << check.name
                 << std::string(width - check.name.size() + 2, ' ') << check.message << "\n";
        if (!check.fix.empty() && check.verdict != Verdict::kPass) {
          c_.out() << std::string(6 + width + 2, ' ') << "fix: " << check.fix << "\n";
        }
      }
      c_.out() << (failed == 0 ? "all checks passed" : std::to_string(failed) + " failed")
               << (warned > 0
                       ? ", " + std::to_string(warned) + " warning" + (warned == 1 ? "" : "s")
                       : "")
               << "\n";
    }
    if (failed == 0) return Status::Ok();
    return Status::FailedPrecondition(std::to_string(failed) + " of " +
                                      std::to_string(checks_.size()) +
                                      " checks failed; each FAIL above says what to fix");
  }

  CliContext& c_;
  const DoctorOptions& o_;
  std::vector<Check> checks_;
  std::string url_;
  std::unique_ptr<MetadataStore> store_;
  std::vector<DatasetRecord> datasets_;
  std::vector<NodeRecord> nodes_;
  std::string sidecar_socket_;  // from a sidecar config given with --config
};

}  // namespace

void AddDoctorCommand(CLI::App& app, CliContext& context) {
  DoctorOptions* o = context.Keep(std::make_unique<DoctorOptions>());
  CLI::App* doctor = app.add_subcommand(
      "doctor", "Check the store, cache nodes, sidecar socket, daemon configs and FUSE");
  doctor->add_option("--socket", o->socket,
                     "Sidecar socket to check (default $GRANARY_SOCKET, a sidecar --config's "
                     "socket, else " +
                         std::string(client::kDefaultSocketPath) + ")");
  doctor->add_option("--config", o->configs,
                     "A granary-cachenode or granary-sidecar YAML file to check (repeatable)");
  context.OnParsed(doctor, [&context, o] { return Doctor(context, *o).Run(); });
}

}  // namespace granary::cli
