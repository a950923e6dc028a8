// Writes the manifest fuzzer's seed corpus: a few valid manifests (format
// version 3), whole files (first byte 0) and bare bodies (first byte 5). Run
// from the fuzz build:
//   make_fuzz_seeds tests/fuzz/corpus/manifest
// The corpus also keeps version 2 seeds made before ctimes and inodes existed
// (*-v2: whole files, and bodies with first byte 1) and version 1 seeds made
// before modes existed (*-v1: whole files, and bodies with first byte 3).

#include <zstd.h>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "granary/core/manifest.h"

namespace {

void Write(const std::string& dir, const std::string& name, char mode, const std::string& bytes) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.put(mode);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_fuzz_seeds <corpus-dir>\n";
    return 2;
  }
  std::string dir = argv[1];
  granary::ManifestHeaderInfo h;
  h.source_uri = "file:///data";
  h.chunk_size = 1024;
  h.include = {"*.jpg"};
  std::vector<std::vector<granary::FileEntry>> sets = {
      {},
      {{"a", 1, 1}},
      {{"a/x.jpg", 100, 5}, {"a/y.jpg", 2000, 6}, {"b/c/d.jpg", 0, 7}, {"e.jpg", 1024, 8}},
      {{"cls/a.jpg", 10, 5, 0640, 1'700'000'000'123'456'789, 131},
       {"top", 3, 6, 04755, 1'700'000'001'000'000'000, 1ull << 40}},
  };
  // Directories with modes, one without files, for the last set.
  std::vector<granary::DirectoryEntry> dirs = {{"", 0750}, {"cls", 0700}, {"empty/inner", 01777}};
  int i = 0;
  for (auto& entries : sets) {
    auto m = granary::Manifest::FromEntries(
        h, entries,
        i + 1 == static_cast<int>(sets.size()) ? dirs : std::vector<granary::DirectoryEntry>{});
    if (!m.ok()) {
      std::cerr << m.status().ToString() << "\n";
      return 1;
    }
    std::string file = m->Encode();
    Write(dir, "file" + std::to_string(i), 0, file);
    // The body under the 64-byte header, for the body parser (mode 5: version 3).
    std::string frame = file.substr(64);
    std::string body(ZSTD_getFrameContentSize(frame.data(), frame.size()), '\0');
    size_t n = ZSTD_decompress(body.data(), body.size(), frame.data(), frame.size());
    if (ZSTD_isError(n)) return 1;
    Write(dir, "body" + std::to_string(i), 5, body);
    ++i;
  }
  std::cout << "wrote " << i << " seeds to " << dir << "\n";
  return 0;
}
