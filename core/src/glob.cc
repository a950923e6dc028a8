#include "granary/core/glob.h"

namespace granary {
namespace {

std::vector<std::string_view> Split(std::string_view path) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    if (slash > start) parts.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return parts;
}

// Matches one bracket expression at p[i] against c; advances i past it.
bool MatchClass(std::string_view p, size_t* i, char c) {
  size_t j = *i + 1;
  bool negate = j < p.size() && (p[j] == '!' || p[j] == '^');
  if (negate) ++j;
  bool matched = false;
  bool first = true;
  while (j < p.size() && (first || p[j] != ']')) {
    first = false;
    char lo = p[j];
    if (lo == '\\' && j + 1 < p.size()) lo = p[++j];
    char hi = lo;
    if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
      hi = p[j + 2];
      if (hi == '\\' && j + 3 < p.size()) {
        hi = p[j + 3];
        ++j;
      }
      j += 2;
    }
    if (lo <= c && c <= hi) matched = true;
    ++j;
  }
  *i = j + 1;  // past ']' (Compile guarantees it exists)
  return matched != negate;
}

// One component against one pattern component, with backtracking over '*'.
bool MatchComponent(std::string_view p, std::string_view s) {
  size_t pi = 0, si = 0;
  size_t star_p = std::string_view::npos, star_s = 0;
  while (si < s.size()) {
    if (pi < p.size()) {
      char pc = p[pi];
      if (pc == '*') {
        star_p = ++pi;
        star_s = si;
        continue;
      }
      if (pc == '?') {
        ++pi;
        ++si;
        continue;
      }
      if (pc == '[') {
        size_t next = pi;
        if (MatchClass(p, &next, s[si])) {
          pi = next;
          ++si;
          continue;
        }
      } else {
        if (pc == '\\' && pi + 1 < p.size()) pc = p[pi + 1];
        if (pc == s[si]) {
          pi += p[pi] == '\\' ? 2u : 1u;
          ++si;
          continue;
        }
      }
    }
    if (star_p == std::string_view::npos) return false;
    pi = star_p;
    si = ++star_s;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

// Whole pattern against whole path, component by component. "**" makes this a
// search over split points; remembering each (pattern, path) position already
// tried keeps it at most patterns x components steps, whatever the input.
class ComponentMatcher {
 public:
  ComponentMatcher(const std::vector<std::string>& pat, const std::vector<std::string_view>& path)
      : pat_(pat), path_(path), failed_((pat.size() + 1) * (path.size() + 1), false) {}

  bool Match(size_t pi, size_t si) {
    while (pi < pat_.size()) {
      if (pat_[pi] == "**") {
        while (pi < pat_.size() && pat_[pi] == "**") ++pi;  // runs of ** are one
        if (pi == pat_.size()) return true;
        for (size_t k = si; k < path_.size(); ++k) {
          if (MatchMemo(pi, k)) return true;
        }
        return false;
      }
      if (si >= path_.size() || !MatchComponent(pat_[pi], path_[si])) return false;
      ++pi;
      ++si;
    }
    return si == path_.size();
  }

 private:
  bool MatchMemo(size_t pi, size_t si) {
    size_t key = pi * (path_.size() + 1) + si;
    if (failed_[key]) return false;
    if (Match(pi, si)) return true;
    failed_[key] = true;
    return false;
  }

  const std::vector<std::string>& pat_;
  const std::vector<std::string_view>& path_;
  std::vector<bool> failed_;
};

}  // namespace

Result<Glob> Glob::Compile(std::string_view pattern) {
  std::string_view p = pattern;
  while (!p.empty() && p.front() == '/') p.remove_prefix(1);
  if (p.empty())
    return Status::InvalidArgument("glob pattern '" + std::string(pattern) + "' is empty");
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\') {
      if (i + 1 == p.size()) {
        return Status::InvalidArgument("glob pattern '" + std::string(pattern) +
                                       "' ends with a lone '\\'; escape it as '\\\\'");
      }
      ++i;
    } else if (p[i] == '[') {
      size_t j = i + 1;
      if (j < p.size() && (p[j] == '!' || p[j] == '^')) ++j;
      if (j < p.size() && p[j] == ']') ++j;  // a leading ']' is literal
      while (j < p.size() && p[j] != ']' && p[j] != '/') j += p[j] == '\\' ? 2u : 1u;
      if (j >= p.size() || p[j] != ']') {
        return Status::InvalidArgument("glob pattern '" + std::string(pattern) +
                                       "' has an unterminated '[' at position " +
                                       std::to_string(i) + "; close it with ']' or escape it");
      }
      i = j;
    }
  }
  Glob g;
  g.pattern_ = std::string(pattern);
  for (std::string_view c : Split(p)) g.components_.emplace_back(c);
  g.basename_only_ = p.find('/') == std::string_view::npos;
  return g;
}

bool Glob::Match(std::string_view path) const {
  std::vector<std::string_view> parts = Split(path);
  if (basename_only_) {
    if (components_[0] == "**") return true;
    return !parts.empty() && MatchComponent(components_[0], parts.back());
  }
  return ComponentMatcher(components_, parts).Match(0, 0);
}

Result<GlobSet> GlobSet::Compile(const std::vector<std::string>& patterns) {
  GlobSet set;
  for (const auto& p : patterns) {
    GRANARY_ASSIGN_OR_RETURN(Glob g, Glob::Compile(p));
    set.globs_.push_back(std::move(g));
  }
  return set;
}

bool GlobSet::Match(std::string_view path) const {
  for (const auto& g : globs_) {
    if (g.Match(path)) return true;
  }
  return false;
}

}  // namespace granary
