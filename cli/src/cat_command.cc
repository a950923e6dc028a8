// `granary cat NAME PATH...`: a dataset's files, byte for byte, read from the
// cache (docs/cli.md, "Reading a dataset"): through the host's sidecar when
// there is one (client::Session), else straight from the cache nodes
// (sidecar::SampleFetcher), never from a copy in this process's memory larger
// than one sample.
//
// Who may read what (direct path): the cache nodes' protocol carries no user,
// so this command applies the rule the source applies (DESIGN.md, "a user can
// only read datasets they could read at the source"): root and the dataset's
// owner read it; anyone else must be able to read the file at the source
// themselves (access(2) with the effective ids; one metadata call on the
// source per file). When no cache node can serve a sample, the fetcher reads
// the source (fall-through) as the invoking user, never with more rights:
// root reads as the dataset's owner (the identity the cache nodes stage with);
// any other user as themselves (the fetcher's identity executor cannot switch
// users without root). --no-source turns fall-through off. Through a sidecar,
// its socket's permissions are the boundary, as for every client.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cli_context.h"
#include "direct_reader.h"
#include "granary/client/session.h"
#include "granary/core/config.h"
#include "granary/core/log.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "granary/fetcher/sample_fetcher.h"
#include "granary/source/posix_source.h"
#include "manifest_tree.h"

namespace granary::cli {
namespace {

// Bytes per write(2) (and per ostream write).
constexpr size_t kWritePiece = 1u << 20;

struct CatOptions {
  std::string dataset;
  std::vector<std::string> paths;
  std::string socket;
  bool direct = false;
  bool no_source = false;
  std::string local_node_socket;  // empty: DefaultLocalNodeSockets()
  std::string local_node;
  std::string timeout = "2m";
};

// Where the bytes go: the stdout descriptor (pieces, EPIPE noticed) or the
// context's stream.
class ByteSink {
 public:
  explicit ByteSink(CliContext& c) : c_(c) {}

  // kIoError when the bytes could not be written; reader_gone() after EPIPE.
  Status Write(std::string_view bytes) {
    const int fd = c_.stdout_fd();
    while (!bytes.empty()) {
      const size_t piece = std::min(bytes.size(), kWritePiece);
      if (fd < 0) {
        c_.out().write(bytes.data(), static_cast<std::streamsize>(piece));
        if (!c_.out().good()) return Status::IoError("writing to the output stream failed");
      } else {
        const ssize_t n = write(fd, bytes.data(), piece);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          const int e = errno;
          if (e == EPIPE) reader_gone_ = true;
          return Status::IoError(std::string("writing to standard output: ") + std::strerror(e));
        }
        bytes.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      bytes.remove_prefix(piece);
    }
    return Status::Ok();
  }
  bool reader_gone() const { return reader_gone_; }

 private:
  CliContext& c_;
  bool reader_gone_ = false;
};

// A per-file failure keeps its meaning for the exit code when it is about
// the path (2 unsafe, 3 not found); anything else is 1 (exit 4 is for the
// metadata store only).
Status AsFileFailure(const Status& s) {
  if (s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kNotFound) return s;
  return Status::FailedPrecondition(s.message());
}

// Logs at error level and above while it lives, unless GRANARY_LOG_LEVEL
// asks for something else; the previous level after.
class QuietLogs {
 public:
  QuietLogs() : active_(std::getenv("GRANARY_LOG_LEVEL") == nullptr) {
    if (active_) {
      previous_ = spdlog::get_level();
      SetLogLevel(spdlog::level::err);
    }
  }
  ~QuietLogs() {
    if (active_) SetLogLevel(previous_);
  }
  QuietLogs(const QuietLogs&) = delete;
  QuietLogs& operator=(const QuietLogs&) = delete;

 private:
  const bool active_;
  spdlog::level::level_enum previous_ = spdlog::level::info;
};

class Cat {
 public:
  Cat(CliContext& c, const CatOptions& o) : c_(c), o_(o), sink_(c) {}

  Status Run() {
    GRANARY_RETURN_IF_ERROR(ValidateDatasetName(o_.dataset));
    if (o_.direct && !o_.socket.empty()) {
      return Status::InvalidArgument("--direct and --socket: choose one way to read");
    }
    Result<std::chrono::milliseconds> timeout = ParseDuration(o_.timeout);
    if (!timeout.ok()) return Status::InvalidArgument("--timeout: " + timeout.status().message());
    timeout_ = *timeout;
    // Every path is checked before anything is read.
    for (const std::string& p : o_.paths) {
      GRANARY_ASSIGN_OR_RETURN(std::string path, NormalizeDatasetPath(p));
      if (path.empty()) {
        return Status::InvalidArgument("path " + Quoted(p) +
                                       " is the dataset's root, a directory; name files "
                                       "(`granary ls " +
                                       o_.dataset + "` lists them)");
      }
      paths_.push_back(std::move(path));
    }
    c_.out().flush();
    const std::string socket = SocketToUse();
    Status s = socket.empty() ? Direct() : ThroughSidecar(socket);
    if (sink_.reader_gone()) return Status::Ok();  // `| head`: quietly
    if (!s.ok()) return s;
    if (failed_ > 0) {
      return Status(first_failure_.code(), std::to_string(failed_) + " of " +
                                               std::to_string(paths_.size()) +
                                               " files could not be read (see above)");
    }
    return Status::Ok();
  }

 private:
  // The sidecar socket to read through, or empty for the direct path:
  // --socket, else $GRANARY_SOCKET, else the default path if a socket is
  // there; --direct never.
  std::string SocketToUse() {
    if (o_.direct) return "";
    if (!o_.socket.empty()) return o_.socket;
    const char* env = std::getenv(std::string(client::kSocketEnvVar).c_str());
    if (env != nullptr && *env != '\0') return env;
    const std::string fallback(client::kDefaultSocketPath);
    struct stat st {};
    if (stat(fallback.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return fallback;
    return "";
  }

  // A file that failed: said now, counted for the exit status.
  void Failed(const std::string& path, const Status& s) {
    const Status f = AsFileFailure(s);
    c_.err() << "granary: cat " << path << ": " << f.message() << "\n";
    if (failed_++ == 0) first_failure_ = f;
  }

  Status ThroughSidecar(const std::string& socket) {
    client::SessionOptions so;
    so.socket_path = socket;
    so.client_name = "granary-cat/" + std::to_string(getpid());
    so.lookahead = 0;
    so.verify_checksums = true;
    so.call_timeout = timeout_;
    Result<std::unique_ptr<client::Session>> session = client::Session::Open(o_.dataset, so);
    if (!session.ok()) {
      const Status& s = session.status();
      std::string fix;
      if (s.code() == StatusCode::kPermissionDenied) {
        fix = "; ask for the socket's group, or use --direct (`granary doctor --socket " + socket +
              "` says what to fix)";
      } else if (s.code() == StatusCode::kUnavailable ||
                 s.code() == StatusCode::kDeadlineExceeded) {
        fix = "; is granary-sidecar running? (--direct reads from the cache nodes instead)";
      }
      const Status failure = AsFileFailure(s);
      if (s.code() == StatusCode::kNotFound) return s;
      return Status(failure.code(), "reading dataset " + Quoted(o_.dataset) +
                                        " through the sidecar at " + socket + ": " + s.message() +
                                        fix);
    }
    for (const std::string& path : paths_) {
      Result<uint32_t> id = (*session)->Lookup(path);
      if (!id.ok()) {
        Failed(path, id.status());
        continue;
      }
      Result<client::SampleView> view = (*session)->Get(*id);
      if (!view.ok()) {
        Failed(path, view.status());
        continue;
      }
      const Status written = sink_.Write(view->bytes());
      (*session)->Release(*view);
      if (sink_.reader_gone()) return Status::Ok();
      if (!written.ok()) return written;
    }
    return Status::Ok();
  }

  Status Direct() {
    GRANARY_RETURN_IF_ERROR(c_.OpenExistingStore());
    GRANARY_ASSIGN_OR_RETURN(DatasetRecord record, c_.store().GetDataset(o_.dataset));
    if (record.state.phase == DatasetPhase::kDeleting) {
      return Status::FailedPrecondition("dataset " + Quoted(o_.dataset) + " is being deleted");
    }
    GRANARY_ASSIGN_OR_RETURN(std::shared_ptr<const Manifest> manifest,
                             LoadManifest(c_.store(), record));
    // The fetcher's warnings (a node skipped) would interleave with the
    // output; the summary below says what happened instead.
    QuietLogs quiet;
    DirectReaderOptions ro;
    ro.client_name = "granary-cat";
    ro.source_fallthrough = !o_.no_source;
    ro.timeout = timeout_;
    GRANARY_ASSIGN_OR_RETURN(ro.credentials, c_.PeerCredentials());
    // Without the cluster key, nodes that require it refuse this user: the
    // node on this host serves it through its handoff socket, checking its uid.
    const bool keyless = c_.ClusterKeyPath().empty();
    if (keyless) ReadThroughLocalHandoff(&ro, o_.local_node_socket, o_.local_node);
    GRANARY_ASSIGN_OR_RETURN(ro.tls, c_.Tls());
    ro.fabric = c_.Fabric();
    Result<std::unique_ptr<DirectReader>> reader =
        DirectReader::Create(c_.store(), record, manifest, ro);
    if (!reader.ok() && reader.status().code() == StatusCode::kFailedPrecondition) {
      return Status::FailedPrecondition(reader.status().message() + " (drop --no-source)");
    }
    GRANARY_RETURN_IF_ERROR(reader.status());
    DirectReader& direct = **reader;

    for (const std::string& path : paths_) {
      Result<TreeNode> node = ResolvePath(*manifest, path, o_.dataset);
      if (!node.ok()) {
        Failed(path, node.status());
        continue;
      }
      if (node->directory) {
        Failed(path, Status::FailedPrecondition("is a directory (`granary ls " + o_.dataset + " " +
                                                path + "` lists it)"));
        continue;
      }
      if (Status may = direct.MayRead(node->first); !may.ok()) {
        Failed(path, may);
        continue;
      }
      const uint64_t size = manifest->SizeOf(node->first);
      // One sample at a time: its size is bounded by the manifest.
      std::unique_ptr<char[]> buffer(new (std::nothrow) char[std::max<uint64_t>(size, 1)]);
      if (!buffer) {
        Failed(path, Status::ResourceExhausted("cannot allocate " + HumanBytes(size) +
                                               " to read it; read it through a sidecar"));
        continue;
      }
      if (Status read = direct.Read(node->first, std::span<char>(buffer.get(), size)); !read.ok()) {
        if (keyless && read.code() != StatusCode::kFailedPrecondition) {
          read = Status(read.code(), read.message() +
                                         "; without the cluster key (--cluster-key-file, root's) "
                                         "cache nodes that require it refuse you, and " +
                                         direct.local_node_note() +
                                         ": run as root with the cluster key, or read through a "
                                         "sidecar (--socket)");
        }
        Failed(path, read);
        continue;
      }
      const Status written = sink_.Write(std::string_view(buffer.get(), size));
      if (sink_.reader_gone()) return Status::Ok();
      if (!written.ok()) return written;
    }
    const sidecar::SampleFetcherCounters counters = direct.counters();
    const uint64_t from_source =
        counters.samples[static_cast<size_t>(sidecar::SampleSource::kSource)];
    if (from_source > 0 || counters.node_failures > 0) {
      c_.err() << "granary: cat: " << from_source << " of " << paths_.size()
               << " files were read from the source (" << counters.node_failures
               << " cache node failures; `granary node list` shows the live nodes)\n";
    }
    return Status::Ok();
  }

  CliContext& c_;
  const CatOptions& o_;
  ByteSink sink_;
  std::chrono::milliseconds timeout_{0};
  std::vector<std::string> paths_;
  size_t failed_ = 0;
  Status first_failure_;
};

}  // namespace

void AddCatCommand(CLI::App& app, CliContext& context) {
  CatOptions* o = context.Keep(std::make_unique<CatOptions>());
  CLI::App* cat = app.add_subcommand(
      "cat", "Write a dataset's files to stdout, read from the cache (sidecar or cache nodes)");
  cat->add_option("name", o->dataset, "Dataset name")->required();
  cat->add_option("paths", o->paths, "Files in the dataset")->required();
  cat->add_option("--socket", o->socket,
                  "Read through the sidecar at this socket (default $GRANARY_SOCKET, else " +
                      std::string(client::kDefaultSocketPath) + " if it exists)");
  cat->add_flag("--direct", o->direct, "Read from the cache nodes, not through a sidecar");
  cat->add_flag("--no-source", o->no_source,
                "Direct reads: fail rather than read the source when no cache node serves a file");
  cat->add_option("--timeout", o->timeout, "Longest wait for one file, e.g. 30s (default 2m)");
  cat->add_option("--local-node-socket", o->local_node_socket,
                  "Direct reads without the cluster key: the handoff socket (`local_socket`) of "
                  "the cache node on this host (default " +
                      DefaultLocalNodeSockets()[0] + ", else " + DefaultLocalNodeSockets()[1] +
                      ")");
  cat->add_option("--local-node", o->local_node,
                  "Direct reads without the cluster key: that cache node's id (default: the host "
                  "name)");
  context.OnParsed(cat, [&context, o] { return Cat(context, *o).Run(); });
}

}  // namespace granary::cli
