#include "granary/peer/peer_auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "granary/core/byte_order.h"
#include "granary/core/file.h"
#include "granary/core/names.h"

namespace granary {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

std::string ToHex(const uint8_t* data, size_t size) {
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out += kHexDigits[data[i] >> 4];
    out += kHexDigits[data[i] & 0xf];
  }
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

void FillRandom(uint8_t* out, size_t size) {
  size_t done = 0;
  for (int round = 0; done < size && round < 64; ++round) {
    ssize_t n = ::getrandom(out + done, size - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    done += static_cast<size_t>(n);
  }
  // The kernel's random source does not fail after boot; a nonce or key made
  // of anything else would be a silent weakness, so stop instead.
  if (done != size) throw std::runtime_error("getrandom(2) failed: no random bytes for a nonce");
}

}  // namespace

std::string KeyIdHex(const KeyId& id) { return ToHex(id.data(), id.size()); }

KeyId ClusterKeyId(std::string_view key) {
  static constexpr std::string_view kLabel = "granary cluster key id";
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  EVP_DigestUpdate(ctx, kLabel.data(), kLabel.size());
  EVP_DigestUpdate(ctx, key.data(), key.size());
  EVP_DigestFinal_ex(ctx, digest, &length);
  EVP_MD_CTX_free(ctx);
  KeyId id{};
  std::memcpy(id.data(), digest, id.size());
  return id;
}

Result<ClusterKeys> ClusterKeys::FromKeys(std::vector<std::string> keys) {
  if (keys.empty() || keys.size() > kMaxKeys) {
    return Status::InvalidArgument("a cluster key file holds 1 or 2 keys (2 while rotating), not " +
                                   std::to_string(keys.size()));
  }
  ClusterKeys out;
  for (std::string& key : keys) {
    if (key.size() < kMinKeyBytes) {
      return Status::InvalidArgument("a cluster key of " + std::to_string(key.size()) +
                                     " bytes; keys are at least " + std::to_string(kMinKeyBytes) +
                                     " bytes (`granary cluster-key generate` makes one)");
    }
    out.ids_.push_back(ClusterKeyId(key));
    out.keys_.push_back(std::move(key));
  }
  if (out.ids_.size() == 2 && out.ids_[0] == out.ids_[1]) {
    return Status::InvalidArgument("the cluster key file holds the same key twice");
  }
  return out;
}

std::string ReadableDefaultClusterKeyPath() {
  return ::access(kDefaultClusterKeyPath, R_OK) == 0 ? kDefaultClusterKeyPath : "";
}

Result<ClusterKeys> ClusterKeys::Load(const std::string& path) {
  const std::string what = "cluster key file " + Quoted(path);
  // Symbolic links are followed (a Kubernetes Secret volume is made of
  // them): the checks below are of the file opened, whoever made the link.
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) {
    const int err = errno;
    Status s = Status::FromErrno(err, "open " + what);
    if (err == ENOENT) {
      return Status::NotFound(
          s.message() + "; create it with `granary cluster-key generate --out " + path +
          "` and copy it to every cache node and admin host (docs/security.md)");
    }
    return s;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "fstat " + what);
  if (!S_ISREG(st.st_mode)) return Status::PermissionDenied(what + " is not a regular file");
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return Status::PermissionDenied(what + " is owned by uid " + std::to_string(st.st_uid) +
                                    ", not by this process's user (" + std::to_string(::geteuid()) +
                                    ") or root: another user could have written it; chown it");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status::PermissionDenied(what + " has mode " + mode +
                                    ": group or others may read it, and whoever reads it can "
                                    "read every dataset; run `chmod 600 " +
                                    path + "`");
  }
  if (st.st_size > 64 * 1024) {
    return Status::InvalidArgument(what + " is " + std::to_string(st.st_size) +
                                   " bytes; a key file holds one or two lines of hex");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  GRANARY_RETURN_IF_ERROR(PreadFull(fd.get(), text.data(), text.size(), 0, what));
  Result<ClusterKeys> loaded = Parse(text, what);
  if (!loaded.ok()) return loaded.status();
  loaded->path_ = path;
  return loaded;
}

Result<ClusterKeys> ClusterKeys::Parse(std::string_view text, const std::string& what) {
  std::vector<std::string> keys;
  size_t line_no = 0;
  std::string_view rest = text;
  while (!rest.empty()) {
    size_t end = rest.find('\n');
    std::string_view line = Trim(rest.substr(0, end));
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    if (line.size() % 2 != 0) {
      return Status::InvalidArgument(what + " line " + std::to_string(line_no) +
                                     ": a key is an even number of hex digits, this line has " +
                                     std::to_string(line.size()) + " characters");
    }
    std::string key(line.size() / 2, '\0');
    for (size_t i = 0; i < key.size(); ++i) {
      int hi = HexValue(line[2 * i]), lo = HexValue(line[2 * i + 1]);
      if (hi < 0 || lo < 0) {
        return Status::InvalidArgument(what + " line " + std::to_string(line_no) +
                                       ": not a hex key (character " + std::to_string(2 * i + 1) +
                                       "); write the key as hex digits only");
      }
      key[i] = static_cast<char>(hi * 16 + lo);
    }
    keys.push_back(std::move(key));
  }
  Result<ClusterKeys> parsed = FromKeys(std::move(keys));
  if (!parsed.ok()) return parsed.status().WithContext(what);
  return parsed;
}

const std::string* ClusterKeys::Find(const KeyId& id) const {
  for (size_t i = 0; i < ids_.size(); ++i) {
    if (CRYPTO_memcmp(ids_[i].data(), id.data(), id.size()) == 0) return &keys_[i];
  }
  return nullptr;
}

Result<std::string> GenerateClusterKeyHex() {
  uint8_t key[32];
  FillRandom(key, sizeof(key));
  return ToHex(key, sizeof(key));
}

AuthProof ClusterKeyProof(std::string_view key, ProofRole role, const AuthNonce& client_nonce,
                          const AuthNonce& server_nonce, std::string_view server_name,
                          std::string_view client_name, std::string_view binding) {
  std::string message =
      role == ProofRole::kServer ? "granary-auth-v2 server" : "granary-auth-v2 client";
  message.append(reinterpret_cast<const char*>(client_nonce.data()), client_nonce.size());
  message.append(reinterpret_cast<const char*>(server_nonce.data()), server_nonce.size());
  // Length-prefixed names: ("ab", "c") and ("a", "bc") differ.
  auto put_name = [&](std::string_view name) {
    uint8_t length[2];
    StoreLe<uint16_t>(length, static_cast<uint16_t>(name.size()));
    message.append(reinterpret_cast<const char*>(length), 2);
    message.append(name);
  };
  put_name(server_name);
  put_name(client_name);
  if (!binding.empty()) {
    message.append("tls");
    put_name(binding);
  }
  AuthProof proof{};
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), proof.data(),
       &length);
  return proof;
}

bool ProofsEqual(const AuthProof& a, const AuthProof& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

AuthNonce RandomNonce() {
  AuthNonce nonce{};
  FillRandom(nonce.data(), nonce.size());
  return nonce;
}

std::string PeerIdentity::Scope() const {
  return kind == Kind::kCluster ? std::string("cluster") : "namespace/" + namespace_;
}

}  // namespace granary
