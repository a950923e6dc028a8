#pragma once

// Authentication on the cache node's wire protocol (version 2; docs/protocol.md,
// "Authentication"; docs/security.md): the cluster key and what is derived from
// it, the identities a node grants, and the seam for Kubernetes tokens. No
// sockets and no OpenSSL in this header.
//
// Cluster key (cache nodes, sidecars on Slurm nodes, `granary` run by admins):
// a file only its owner reads, one key per line as hex (at least 32 bytes,
// 64 hex digits), `#` comments and blank lines ignored, at most two keys. The
// first key is the one a client uses; a server accepts both, which is how a key
// is rotated (docs/security.md, "Rotating the cluster key"). The key never
// travels: the client names it by KeyId, each side proves it holds it with an
// HMAC-SHA256 over both nonces and both peer names (ClusterKeyProof), and the
// server's fresh nonce makes a recorded proof useless on another connection.
//
// Kubernetes token (sidecars in pods): the pod's projected ServiceAccount token
// with audience "granary", checked by a TokenVerifier (the cache node's is
// TokenReview against the API server, cachenode/token_review.h). It grants the
// token's namespace only: datasets whose record names that namespace.
//
// Thread safety: ClusterKeys is immutable after Load; the free functions are
// pure (RandomNonce reads the kernel's random source). A TokenVerifier must
// accept concurrent calls.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/status.h"
#include "granary/protocol/protocol.h"

namespace granary {

// Where `granary cluster-key generate` writes the cluster key, and where the
// same-host clients run by root (the CLI, a sidecar) look for it when they
// are given none.
inline constexpr char kDefaultClusterKeyPath[] = "/etc/granary/cluster.key";
// kDefaultClusterKeyPath when this process may read it (root, usually), else
// empty: another user reads without a key.
std::string ReadableDefaultClusterKeyPath();

using KeyId = std::array<uint8_t, protocol_format::kAuthKeyIdSize>;

// "3f9a0c1e5b7d2a64": a key id as hex, for logs and messages.
std::string KeyIdHex(const KeyId& id);

class ClusterKeys {
 public:
  // At least this many bytes per key.
  static constexpr size_t kMinKeyBytes = 32;
  static constexpr size_t kMaxKeys = 2;

  // Reads `path`. Refused (kPermissionDenied, naming the file and the fix)
  // unless it is a regular file owned by this process's user or root and
  // neither group nor others may read or write it (checked on the file
  // opened, so a symbolic link leads only to such a file); refused
  // (kInvalidArgument, naming the line) unless it holds one or two keys of
  // even-length hex, at least kMinKeyBytes each.
  static Result<ClusterKeys> Load(const std::string& path);
  // The contents of a key file (the rules of Load past the file's mode);
  // `what` starts every message. The fuzz target's entry point.
  static Result<ClusterKeys> Parse(std::string_view text, const std::string& what);
  // From raw keys (tests, and a key a caller already holds): 1..kMaxKeys,
  // each at least kMinKeyBytes.
  static Result<ClusterKeys> FromKeys(std::vector<std::string> keys);

  // The key a client uses: the first.
  const std::string& current() const { return keys_.front(); }
  KeyId current_id() const { return ids_.front(); }
  // The key with this id, or nullptr.
  const std::string* Find(const KeyId& id) const;
  size_t size() const { return keys_.size(); }
  const std::string& path() const { return path_; }

 private:
  std::vector<std::string> keys_;  // raw bytes
  std::vector<KeyId> ids_;
  std::string path_;
};

// A fresh key as hex (64 digits, 32 bytes from the kernel's random source),
// what `granary cluster-key generate` writes.
Result<std::string> GenerateClusterKeyHex();

// The id a client sends for `key`: the first 8 bytes of
// SHA-256("granary cluster key id" || key).
KeyId ClusterKeyId(std::string_view key);

// Who proves: the server's proof and the client's differ by this label, so one
// cannot be replayed as the other.
enum class ProofRole { kServer, kClient };

// HMAC-SHA256(key, "granary-auth-v2 server|client" || client_nonce ||
// server_nonce || len-prefixed server_name || len-prefixed client_name
// [|| "tls" || binding]). `binding`: the TLS session's channel binding
// (TlsStream::ChannelBinding) when the connection is TLS, so that a relay
// holding two TLS sessions cannot pass the proofs on; empty otherwise.
AuthProof ClusterKeyProof(std::string_view key, ProofRole role, const AuthNonce& client_nonce,
                          const AuthNonce& server_nonce, std::string_view server_name,
                          std::string_view client_name, std::string_view binding = {});

// Constant-time comparison of two proofs.
bool ProofsEqual(const AuthProof& a, const AuthProof& b);

// 32 bytes from the kernel's random source (getrandom(2)).
AuthNonce RandomNonce();

// What a server granted a connection.
struct PeerIdentity {
  // Every dataset (a cluster key) or only those of one Kubernetes namespace.
  enum class Kind { kCluster, kNamespace };
  Kind kind = Kind::kCluster;
  std::string namespace_;  // kNamespace only
  std::string subject;     // for logs: "cluster key 3f9a...", "system:serviceaccount:ns:sa"

  // "cluster" or "namespace/<name>": the scope sent in AUTH_REPLY.
  std::string Scope() const;
};

// Checks a Kubernetes token. Implementations may block (a round trip to the
// API server); the cache node's server calls them on its service pool.
class TokenVerifier {
 public:
  virtual ~TokenVerifier() = default;
  // The token's namespace identity, or kPermissionDenied saying why not (wrong
  // audience, expired, unknown signer, not a ServiceAccount); kUnavailable when
  // the check itself could not be made.
  virtual Result<PeerIdentity> Verify(std::string_view token) = 0;
};

// What a client presents (PeerClientOptions::credentials). Both empty: none.
struct ClientCredentials {
  std::shared_ptr<const ClusterKeys> cluster_key;
  // A file holding a Kubernetes token, read again at every connect (projected
  // tokens are rotated by the kubelet).
  std::string token_file;

  bool empty() const { return cluster_key == nullptr && token_file.empty(); }
};

}  // namespace granary
