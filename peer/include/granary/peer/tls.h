#pragma once

// TLS for the cache node's wire protocol (optional; docs/security.md, "TLS"):
// an OpenSSL context per side and a stream over a non-blocking socket that
// the caller drives (the server from its event loops, PeerClient with poll).
// No OpenSSL type in this header.
//
//  - TlsContext::ForServer: the node's certificate chain and key (PEM files);
//    TLS 1.2 and 1.3, no renegotiation, no compression.
//  - TlsContext::ForClient: with a CA file, the server's certificate must
//    chain to it and name the host connected to (DNS name or IP address);
//    without one, the channel is encrypted but the server unverified: the
//    cluster key's proofs are bound to the channel (ChannelBinding), so a
//    relay in the middle cannot pass them on, but a Kubernetes token (a
//    bearer credential) should only travel to a verified server.
//  - TlsStream: Handshake, Read and Write never block. When one cannot go on
//    it says which readiness it waits for (TlsWant); the caller waits for it
//    and calls again with the same arguments. pending() says whether
//    decrypted bytes are buffered (they do not make the socket readable).
//  - MakeSelfSignedCertificate writes a key and a certificate for tests,
//    benchmarks and first installs.
//
// Thread safety: a TlsContext may be shared by any number of streams and
// threads; a TlsStream is used by one thread at a time.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "granary/core/status.h"

namespace granary {

class TlsContext {
 public:
  static Result<std::shared_ptr<TlsContext>> ForServer(const std::string& cert_file,
                                                       const std::string& key_file);
  // `ca_file` empty: no verification of the server (encryption only).
  static Result<std::shared_ptr<TlsContext>> ForClient(const std::string& ca_file);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  bool verifies_server() const { return verify_; }

 private:
  friend class TlsStream;
  TlsContext(void* ctx, bool server, bool verify) : ctx_(ctx), server_(server), verify_(verify) {}
  void* ctx_;  // SSL_CTX
  bool server_;
  bool verify_;
};

// What a blocked TLS operation waits for.
enum class TlsWant { kNothing, kRead, kWrite };

class TlsStream {
 public:
  // Over a connected, non-blocking socket `fd` (borrowed: the caller closes
  // it after the stream). `host`: the name or address the client connected
  // to, checked against the certificate when the context verifies.
  static Result<std::unique_ptr<TlsStream>> Accept(std::shared_ptr<const TlsContext> context,
                                                   int fd);
  static Result<std::unique_ptr<TlsStream>> Connect(std::shared_ptr<const TlsContext> context,
                                                    int fd, const std::string& host);
  ~TlsStream();
  TlsStream(const TlsStream&) = delete;
  TlsStream& operator=(const TlsStream&) = delete;

  // Advances the handshake: kNothing once it is done, else what it waits for.
  // A failed handshake (a client that is not TLS, a certificate that does not
  // verify) is kUnavailable or kPermissionDenied saying why.
  Result<TlsWant> Handshake();
  // Up to `size` bytes into `buf`: > 0 bytes read; 0 with *want set: blocked;
  // 0 with *want == kNothing: the peer closed the stream.
  Result<size_t> Read(void* buf, size_t size, TlsWant* want);
  // Up to `size` bytes of `buf`: > 0 written; 0 with *want set: blocked (call
  // again with the same bytes).
  Result<size_t> Write(const void* buf, size_t size, TlsWant* want);
  // Decrypted bytes buffered, which a Read returns without the socket.
  bool pending() const;
  // 32 bytes both ends derive from this session's keys (RFC 5705 exporter,
  // label "EXPERIMENTAL-granary-auth"): the cluster key's proofs cover them.
  Result<std::array<uint8_t, 32>> ChannelBinding() const;
  // Sends close_notify, best effort, never waiting.
  void Shutdown();

 private:
  TlsStream(std::shared_ptr<const TlsContext> context, void* ssl)
      : context_(std::move(context)), ssl_(ssl) {}
  std::shared_ptr<const TlsContext> context_;
  void* ssl_;  // SSL
};

// A new RSA-2048 key and a self-signed certificate valid for `days`, naming
// `hosts` (DNS names or IP addresses) as subjectAltNames; PEM files, the key
// mode 0600.
Status MakeSelfSignedCertificate(const std::string& cert_file, const std::string& key_file,
                                 const std::vector<std::string>& hosts, int days = 365);

}  // namespace granary
