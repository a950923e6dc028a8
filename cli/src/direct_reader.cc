#include "direct_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "cli_context.h"
#include "granary/core/names.h"
#include "granary/fetcher/sample_fetcher.h"
#include "granary/source/posix_source.h"

namespace granary::cli {

struct DirectReader::State {
  DatasetRecord record;
  std::string root;  // the source root, for MayRead
  std::unique_ptr<sidecar::SampleFetcher> fetcher;
  sidecar::FetchDataset dataset;
  std::string local_note;
  std::atomic<size_t> nodes{0};
};

DirectReader::DirectReader(std::shared_ptr<const Manifest> manifest, std::unique_ptr<State> state)
    : manifest_(std::move(manifest)), state_(std::move(state)) {}

DirectReader::~DirectReader() = default;

Result<std::unique_ptr<DirectReader>> DirectReader::Create(MetadataStore& store,
                                                           const DatasetRecord& record,
                                                           std::shared_ptr<const Manifest> manifest,
                                                           DirectReaderOptions options) {
  auto state = std::make_unique<State>();
  state->record = record;
  GRANARY_ASSIGN_OR_RETURN(state->root, PosixSource::RootFromUri(record.spec.source_uri));
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, store.ListNodes(record.spec.pool));
  if (nodes.empty() && !options.source_fallthrough) {
    return Status::FailedPrecondition("no live cache node in pool " + Quoted(record.spec.pool) +
                                      " to read dataset " + Quoted(record.name) +
                                      " from, and reading the source is off; start "
                                      "granary-cachenode, or allow reading the source");
  }
  sidecar::SampleFetcherOptions fo;
  fo.client_name = options.client_name;
  fo.source_fallthrough = options.source_fallthrough;
  fo.source_concurrency = 2;
  fo.peer.connect_timeout =
      std::min<std::chrono::milliseconds>(options.timeout, std::chrono::seconds(2));
  fo.peer.call_timeout = options.timeout;
  fo.peer.credentials = options.credentials;
  fo.peer.tls = options.tls;
  fo.fabric = options.fabric;
  if (fo.peer.tls == nullptr) {
    GRANARY_ASSIGN_OR_RETURN(fo.peer.tls, TlsContext::ForClient(""));
  }
  char host[256] = {};
  std::string local_id = options.local_node_id;
  if (local_id.empty() && gethostname(host, sizeof(host) - 1) == 0) local_id = host;
  for (const NodeRecord& n : nodes) {
    if (n.id == local_id) fo.local_node_id = n.id;
  }
  if (!options.local_node_sockets.empty()) {
    std::string socket;
    for (const std::string& candidate : options.local_node_sockets) {
      struct stat st;
      if (::stat(candidate.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
        socket = candidate;
        break;
      }
    }
    std::string tried;
    for (const std::string& candidate : options.local_node_sockets) {
      tried += (tried.empty() ? "" : " or ") + Quoted(candidate);
    }
    if (socket.empty()) {
      state->local_note = "there is no cache node handoff socket at " + tried;
    } else if (fo.local_node_id.empty()) {
      state->local_note = "no live cache node of pool " + Quoted(record.spec.pool) + " is named " +
                          Quoted(local_id) + " (the one on this host; --local-node names it)";
    } else {
      fo.local_node_socket = socket;
      state->local_note = "node " + Quoted(fo.local_node_id) +
                          ", read through its handoff socket " + Quoted(socket) +
                          ", serves only staged chunks whose every file you may read";
    }
  }
  // null executor: the fetcher starts its own at the first source read,
  // switching to the identity asked for only when this process is root.
  GRANARY_ASSIGN_OR_RETURN(state->fetcher, sidecar::SampleFetcher::Create(fo, nullptr));
  state->fetcher->SetNodes(nodes);
  state->nodes = nodes.size();
  state->dataset.name = record.name;
  state->dataset.manifest = manifest;
  state->dataset.source_uri = record.spec.source_uri;
  state->dataset.owner = geteuid() == 0 ? record.owner
                                        : DatasetOwner{static_cast<uint32_t>(geteuid()),
                                                       static_cast<uint32_t>(getegid())};
  state->dataset.replication = record.spec.replication;
  state->dataset.nodes = record.spec.nodes;
  return std::unique_ptr<DirectReader>(new DirectReader(std::move(manifest), std::move(state)));
}

Status DirectReader::MayRead(SampleId id) const {
  const DatasetRecord& record = state_->record;
  if (geteuid() == 0 || geteuid() == record.owner.uid) return Status::Ok();
  if (id >= manifest_->sample_count()) {
    return Status::OutOfRange("sample " + std::to_string(id) + " is past the end of dataset " +
                              Quoted(record.name));
  }
  const std::string file = state_->root + "/" + manifest_->PathOf(id);
  if (faccessat(AT_FDCWD, file.c_str(), R_OK, AT_EACCESS) == 0) return Status::Ok();
  const int e = errno;
  return Status::PermissionDenied(
      "dataset " + Quoted(record.name) + " belongs to uid " + std::to_string(record.owner.uid) +
      " (" + UserName(record.owner.uid) + "); you are uid " + std::to_string(geteuid()) + " (" +
      UserName(geteuid()) + ") and cannot read its source file " + Quoted(file) + " (" +
      std::strerror(e) +
      "): only those who may read a file at the source may read it from the cache; ask the "
      "owner for read access there");
}

Status DirectReader::Read(SampleId id, std::span<char> out) {
  if (id >= manifest_->sample_count()) {
    return Status::OutOfRange("sample " + std::to_string(id) + " is past the end of dataset " +
                              Quoted(state_->record.name));
  }
  if (out.size() != manifest_->SizeOf(id)) {
    return Status::InvalidArgument("reading " + Quoted(manifest_->PathOf(id)) + ": a buffer of " +
                                   std::to_string(out.size()) + " bytes for a file of " +
                                   std::to_string(manifest_->SizeOf(id)));
  }
  sidecar::FetchTarget target{id, out};
  sidecar::FetchOutcome outcome;
  state_->fetcher->Fetch(state_->dataset, std::span<const sidecar::FetchTarget>(&target, 1),
                         std::span<sidecar::FetchOutcome>(&outcome, 1));
  return outcome.status;
}

Status DirectReader::RefreshNodes(MetadataStore& store) {
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes,
                           store.ListNodes(state_->record.spec.pool));
  state_->fetcher->SetNodes(nodes);
  state_->nodes = nodes.size();
  return Status::Ok();
}

size_t DirectReader::node_count() const { return state_->nodes.load(); }

const std::string& DirectReader::local_node_note() const { return state_->local_note; }

sidecar::SampleFetcherCounters DirectReader::counters() const {
  return state_->fetcher->counters();
}

void ReadThroughLocalHandoff(DirectReaderOptions* options, const std::string& socket,
                             const std::string& node) {
  options->local_node_sockets =
      socket.empty() ? DefaultLocalNodeSockets() : std::vector<std::string>{socket};
  options->local_node_id = node;
}

}  // namespace granary::cli
