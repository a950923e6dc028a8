#pragma once

// The `granary` command line: what users and scripts call to create, snapshot,
// watch and delete datasets and to see the cluster (docs/cli.md). RunCli is
// the whole program behind main(), callable in-process so tests drive it with
// argument vectors and captured streams.
//
// Exit codes (also in the footer of `granary --help`):
//   0 success
//   1 the operation failed (the message says why and what to do); for
//     `doctor`, a check failed
//   2 bad command line (usage): unknown command or option, bad name, size,
//     duration, or an unsafe path (`..`, absolute)
//   3 not found (no such dataset, node or plan, or path in a dataset)
//   4 the metadata store is unreachable
//   5 timed out (`dataset wait --timeout`)
//
// The store comes from --store, else $GRANARY_STORE, else the embedded SQLite
// file DefaultStoreUrl() names.
//
// Thread safety: RunCli may be called from one thread at a time (it reads the
// environment and writes the given streams).

#include <ostream>
#include <string>
#include <vector>

namespace granary {

inline constexpr int kCliOk = 0;
inline constexpr int kCliFailed = 1;
inline constexpr int kCliUsage = 2;
inline constexpr int kCliNotFound = 3;
inline constexpr int kCliUnavailable = 4;
inline constexpr int kCliTimeout = 5;

// sqlite:///var/lib/granary/granary.db for root, else
// sqlite://$HOME/.local/state/granary/granary.db (or under /tmp/granary-<uid>
// without a HOME).
std::string DefaultStoreUrl();

// Runs `granary` with `args` (without the program name). Human output and
// progress go to `out` and `err`; `--output json` writes one JSON document to
// `out`. `interactive` draws a live progress bar on `err` (a terminal);
// otherwise progress is a line every few seconds.
// `stdout_fd` >= 0: `cat` writes file bytes straight to this descriptor (after
// flushing `out`), in pieces, and a reader that went away (EPIPE; SIGPIPE
// must be ignored) ends it quietly with 0. Otherwise it writes through `out`.
int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           bool interactive = false, int stdout_fd = -1);

}  // namespace granary
