#pragma once

// Names of Granary's threads, as `ps -L`, `top -H`, gdb and /proc/<pid>/task/
// <tid>/comm show them. Every thread a daemon starts is named at its start
// with one of the names docs/architecture.md lists for that daemon ("Threads,
// and what each owns"); tests/integration/thread_names_test.cc starts the
// daemons and fails on a running thread whose name the doc does not list, and
// on a name the doc lists that no code gives.
//
// The kernel keeps 15 bytes: a longer name is cut (and a test fails on it).
//
// Thread safety: each names only the calling thread.

#include <string>
#include <string_view>

namespace granary {

// Names the calling thread (the first 15 bytes of `name`).
void NameThisThread(std::string_view name);
// The calling thread's name.
std::string ThisThreadName();

// Names the calling thread `name` until destroyed, then gives it back its
// name: threads a library starts inherit their creator's name, so wrapping
// their creation names them (e.g. an asio::thread_pool).
class ScopedThreadName {
 public:
  explicit ScopedThreadName(std::string_view name) : previous_(ThisThreadName()) {
    NameThisThread(name);
  }
  ~ScopedThreadName() { NameThisThread(previous_); }
  ScopedThreadName(const ScopedThreadName&) = delete;
  ScopedThreadName& operator=(const ScopedThreadName&) = delete;

 private:
  std::string previous_;
};

}  // namespace granary
