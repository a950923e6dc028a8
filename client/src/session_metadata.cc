// Session's metadata calls: STAT and LIST (paged), LOOKUP of paths (batched
// to the protocol's limits), DIRECTORIES (paged) and PING. Opening and the
// connection are in session.cc, samples in session_samples.cc.
#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <variant>

#include "granary/client/session.h"
#include "granary/core/names.h"

namespace granary::client {

namespace sp = sidecar_protocol;

// ---- metadata ----------------------------------------------------------------------

Result<sp::StatEntry> Session::Stat(uint32_t id) {
  GRANARY_ASSIGN_OR_RETURN(std::vector<sp::StatEntry> entries, List(id, 1));
  return std::move(entries.front());
}

Result<std::vector<sp::StatEntry>> Session::List(uint32_t first, uint32_t count) {
  const std::string doing =
      fmt::format("STAT samples [{}, {}) of dataset {} at the sidecar at {}", first,
                  uint64_t{first} + count, Quoted(dataset_), socket_path_);
  if (uint64_t{first} + count > info_.sample_count) {
    return Status::OutOfRange(
        fmt::format("{}: the dataset has {} samples", doing, info_.sample_count));
  }
  std::vector<sp::StatEntry> entries;
  if (count == 0) return entries;
  entries.reserve(count);
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  const Clock::time_point deadline = Clock::now() + options_.call_timeout;
  uint32_t cursor = first;
  // Each round returns at least one entry (else it is an error): bounded by count.
  for (uint32_t round = 0; round < count && entries.size() < count; ++round) {
    const uint32_t want =
        std::min(count - static_cast<uint32_t>(entries.size()), limits_.max_items);
    GRANARY_ASSIGN_OR_RETURN(sp::Reply reply, Call(sp::Stat{cursor, want},
                                                   sp::MessageType::kStatReply, deadline, doing));
    auto& stat = std::get<sp::StatReply>(reply);
    if (stat.first_id != cursor || stat.entries.empty() || stat.entries.size() > want) {
      return Break(Status::Unavailable(fmt::format(
          "{}: the STAT_REPLY for {} entries from id {} has {} entries from id {}; the connection "
          "is closed",
          doing, want, cursor, stat.entries.size(), stat.first_id)));
    }
    cursor += static_cast<uint32_t>(stat.entries.size());
    for (sp::StatEntry& e : stat.entries) entries.push_back(std::move(e));
  }
  return entries;
}

Result<uint32_t> Session::Lookup(std::string_view path) {
  std::string copy(path);
  std::vector<Result<uint32_t>> got = LookupMany(std::span<const std::string>(&copy, 1));
  return std::move(got.front());
}

std::vector<Result<uint32_t>> Session::LookupMany(std::span<const std::string> paths) {
  std::vector<Result<uint32_t>> out;
  out.reserve(paths.size());
  std::vector<size_t> slots;
  for (size_t i = 0; i < paths.size(); ++i) {
    Status valid = ValidateSamplePath(paths[i]);
    if (!valid.ok()) {
      out.emplace_back(valid.WithContext("look up a path in dataset " + Quoted(dataset_)));
      continue;
    }
    out.emplace_back(Status::Internal("not looked up"));
    slots.push_back(i);
  }
  if (slots.empty()) return out;
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point deadline = Clock::now() + options_.call_timeout;
  const std::string doing =
      "LOOKUP in dataset " + Quoted(dataset_) + " at the sidecar at " + socket_path_;
  const size_t body_room = limits_.max_body_bytes - kBodyOverhead;
  size_t begin = 0;
  // Each round takes at least one path: bounded by their number.
  for (size_t round = 0; round < slots.size() && begin < slots.size(); ++round) {
    sp::Lookup lookup;
    size_t bytes = 0;
    size_t end = begin;
    while (end < slots.size() && lookup.paths.size() < limits_.max_items) {
      const std::string& p = paths[slots[end]];
      if (!lookup.paths.empty() && bytes + 2 + p.size() > body_room) break;
      bytes += 2 + p.size();
      lookup.paths.push_back(p);
      ++end;
    }
    Status usable = CheckUsable();
    Result<sp::Reply> reply = usable.ok()
                                  ? Call(lookup, sp::MessageType::kLookupReply, deadline, doing)
                                  : Result<sp::Reply>(usable);
    if (reply.ok() && std::get<sp::LookupReply>(*reply).items.size() != lookup.paths.size()) {
      reply = Break(Status::Unavailable(
          fmt::format("{}: the LOOKUP_REPLY has {} items for {} paths; the connection is closed",
                      doing, std::get<sp::LookupReply>(*reply).items.size(), lookup.paths.size())));
    }
    if (!reply.ok()) {
      for (size_t i = begin; i < end; ++i) out[slots[i]] = reply.status();
      begin = end;
      continue;
    }
    const auto& items = std::get<sp::LookupReply>(*reply).items;
    for (size_t i = begin; i < end; ++i) {
      const sp::LookupItem& item = items[i - begin];
      const std::string what =
          "look up " + Quoted(lookup.paths[i - begin]) + " in dataset " + Quoted(dataset_);
      if (!item.status.ok()) {
        out[slots[i]] = item.status.WithContext(what);
      } else if (item.id >= info_.sample_count) {
        out[slots[i]] =
            Status::Corruption(fmt::format("{}: the sidecar answered id {}, past the {} samples",
                                           what, item.id, info_.sample_count));
      } else {
        out[slots[i]] = item.id;
      }
    }
    begin = end;
  }
  return out;
}

Result<std::vector<sp::DirectoryItem>> Session::Directories() {
  const std::string doing = "list the directories of dataset " + Quoted(dataset_) +
                            " (DIRECTORIES) at the sidecar at " + socket_path_;
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  if (version_ < sp::kDirectoriesVersion) {
    // A sidecar of that version would answer "unknown request type": say why here.
    return Status::VersionMismatch(fmt::format(
        "{}: the sidecar {} speaks sidecar protocol version {}, listing directories needs "
        "version {} (this client speaks {}..{}); upgrade granary-sidecar on this node",
        doing, Quoted(sidecar_name_), version_, sp::kDirectoriesVersion, sp::kMinVersion,
        sp::kMaxVersion));
  }
  const Clock::time_point deadline = Clock::now() + options_.call_timeout;
  std::vector<sp::DirectoryItem> out;
  uint32_t total = 0;
  uint32_t cursor = 0;
  // Every round but the first adds at least one entry (else it is an error),
  // so the rounds are bounded by the total the first reply announced.
  for (bool first = true;; first = false) {
    const uint32_t want = first ? limits_.max_items : std::min(limits_.max_items, total - cursor);
    GRANARY_ASSIGN_OR_RETURN(
        sp::Reply reply,
        Call(sp::Directories{cursor, want}, sp::MessageType::kDirectoriesReply, deadline, doing));
    auto& page = std::get<sp::DirectoriesReply>(reply);
    if (first) total = page.total;
    if (page.first != cursor || page.total != total || (page.entries.empty() && cursor < total)) {
      return Break(Status::Unavailable(fmt::format(
          "{}: the DIRECTORIES_REPLY from index {} of {} directories has {} entries from index "
          "{} of {}; the connection is closed",
          doing, cursor, total, page.entries.size(), page.first, page.total)));
    }
    for (sp::DirectoryItem& e : page.entries) {
      Status safe = ValidateSamplePath(e.path);
      if (!safe.ok() || (!out.empty() && e.path <= out.back().path)) {
        return Break(Status::Unavailable(fmt::format(
            "{}: the sidecar sent directory {} {}; the connection is closed", doing, Quoted(e.path),
            safe.ok() ? "out of order (directories come sorted by path, each once)"
                      : "with an unsafe path (" + safe.message() + ")")));
      }
      out.push_back(std::move(e));
    }
    cursor += static_cast<uint32_t>(page.entries.size());
    if (cursor == total) return out;
  }
}

Status Session::Ping() {
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  return Call(sp::Ping{}, sp::MessageType::kPong, Clock::now() + options_.call_timeout,
              "PING the sidecar at " + socket_path_)
      .status();
}

}  // namespace granary::client
