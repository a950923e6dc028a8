#pragma once

// Include/exclude globs for dataset snapshots.
//
// Syntax, matched against '/'-separated paths relative to the source root:
//   *        any run of characters within one component (not '/')
//   ?        one character (not '/')
//   [abc] [a-z] [!a-z] [^a-z]   one character from (or not from) a set
//   **       as a whole component: zero or more components
//   \c       the character c itself
// A pattern without '/' matches the last component at any depth ("*.jpg" is
// every JPEG anywhere, like .gitignore); a pattern with '/' matches the whole
// path ("train/**/*.jpg"). A leading '/' is ignored.
//
// Thread safety: a compiled Glob is immutable; Match may be called concurrently.

#include <string>
#include <string_view>
#include <vector>

#include "granary/core/status.h"

namespace granary {

class Glob {
 public:
  // Rejects empty patterns, unterminated '[' and trailing '\'.
  static Result<Glob> Compile(std::string_view pattern);

  bool Match(std::string_view path) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::vector<std::string> components_;  // of the pattern, "**" kept as is
  bool basename_only_ = false;
};

// A list of globs: matches if any of them does.
class GlobSet {
 public:
  static Result<GlobSet> Compile(const std::vector<std::string>& patterns);
  bool empty() const { return globs_.empty(); }
  bool Match(std::string_view path) const;

 private:
  std::vector<Glob> globs_;
};

}  // namespace granary
