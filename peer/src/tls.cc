#include "granary/peer/tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <memory>

#include "granary/core/file.h"
#include "granary/core/names.h"

namespace granary {
namespace {

SSL_CTX* Ctx(void* p) { return static_cast<SSL_CTX*>(p); }
SSL* Ssl(void* p) { return static_cast<SSL*>(p); }

// The OpenSSL error queue as text (and emptied).
std::string OpenSslErrors() {
  std::string out;
  for (int i = 0; i < 8; ++i) {
    unsigned long e = ERR_get_error();
    if (e == 0) break;
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    out += (out.empty() ? "" : "; ") + std::string(buf);
  }
  ERR_clear_error();
  return out.empty() ? "no detail from OpenSSL" : out;
}

SSL_CTX* NewContext(bool server) {
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) return nullptr;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  // A Write of a large reply may be completed in parts and retried from a
  // buffer that moved (the caller keeps the bytes, not their address).
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return ctx;
}

// Maps an SSL_* return value: a want, a clean close, or an error.
Result<TlsWant> Classify(SSL* ssl, int rc, const char* doing, bool* closed) {
  const int err = SSL_get_error(ssl, rc);
  switch (err) {
    case SSL_ERROR_WANT_READ:
      return TlsWant::kRead;
    case SSL_ERROR_WANT_WRITE:
      return TlsWant::kWrite;
    case SSL_ERROR_ZERO_RETURN:
      if (closed != nullptr) *closed = true;
      return TlsWant::kNothing;
    case SSL_ERROR_SYSCALL:
      if (ERR_peek_error() == 0) {
        if (closed != nullptr) *closed = true;  // EOF without close_notify
        return TlsWant::kNothing;
      }
      [[fallthrough]];
    default:
      return Status::Unavailable(std::string("TLS ") + doing + ": " + OpenSslErrors());
  }
}

}  // namespace

TlsContext::~TlsContext() { SSL_CTX_free(Ctx(ctx_)); }

Result<std::shared_ptr<TlsContext>> TlsContext::ForServer(const std::string& cert_file,
                                                          const std::string& key_file) {
  SSL_CTX* ctx = NewContext(true);
  if (ctx == nullptr) return Status::Internal("TLS: " + OpenSslErrors());
  std::shared_ptr<TlsContext> out(new TlsContext(ctx, true, false));
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1) {
    return Status::InvalidArgument("TLS certificate " + Quoted(cert_file) + " cannot be used: " +
                                   OpenSslErrors() + "; give a PEM certificate (chain) file");
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    const std::string why = OpenSslErrors();
    if (why.find("key values mismatch") != std::string::npos) {
      return Status::InvalidArgument("TLS key " + Quoted(key_file) +
                                     " does not match the certificate " + Quoted(cert_file) +
                                     "; give the key the certificate was made for");
    }
    return Status::InvalidArgument("TLS key " + Quoted(key_file) + " cannot be used: " + why +
                                   "; give the PEM private key");
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return Status::InvalidArgument("TLS key " + Quoted(key_file) +
                                   " does not match the certificate " + Quoted(cert_file));
  }
  return out;
}

Result<std::shared_ptr<TlsContext>> TlsContext::ForClient(const std::string& ca_file) {
  SSL_CTX* ctx = NewContext(false);
  if (ctx == nullptr) return Status::Internal("TLS: " + OpenSslErrors());
  std::shared_ptr<TlsContext> out(new TlsContext(ctx, false, !ca_file.empty()));
  if (!ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr) != 1) {
      return Status::InvalidArgument("TLS CA file " + Quoted(ca_file) + " cannot be used: " +
                                     OpenSslErrors() + "; give the PEM certificate(s) to trust");
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  }
  return out;
}

Result<std::unique_ptr<TlsStream>> TlsStream::Accept(std::shared_ptr<const TlsContext> context,
                                                     int fd) {
  SSL* ssl = SSL_new(Ctx(context->ctx_));
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    if (ssl != nullptr) SSL_free(ssl);
    return Status::Internal("TLS: " + OpenSslErrors());
  }
  SSL_set_accept_state(ssl);
  return std::unique_ptr<TlsStream>(new TlsStream(std::move(context), ssl));
}

Result<std::unique_ptr<TlsStream>> TlsStream::Connect(std::shared_ptr<const TlsContext> context,
                                                      int fd, const std::string& host) {
  SSL* ssl = SSL_new(Ctx(context->ctx_));
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    if (ssl != nullptr) SSL_free(ssl);
    return Status::Internal("TLS: " + OpenSslErrors());
  }
  std::unique_ptr<TlsStream> stream(new TlsStream(std::move(context), ssl));
  if (stream->context_->verify_) {
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    in6_addr probe{};
    const bool ip = ::inet_pton(AF_INET, host.c_str(), &probe) == 1 ||
                    ::inet_pton(AF_INET6, host.c_str(), &probe) == 1;
    const int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str())
                      : X509_VERIFY_PARAM_set1_host(param, host.c_str(), host.size());
    if (ok != 1) return Status::InvalidArgument("TLS: cannot verify host " + Quoted(host));
    if (!ip) {
      // SSL_set_tlsext_host_name is a macro with a C cast.
      SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
               const_cast<char*>(host.c_str()));
    }
  }
  SSL_set_connect_state(ssl);
  return stream;
}

TlsStream::~TlsStream() { SSL_free(Ssl(ssl_)); }

Result<TlsWant> TlsStream::Handshake() {
  SSL* ssl = Ssl(ssl_);
  ERR_clear_error();
  const int rc = SSL_do_handshake(ssl);
  if (rc == 1) return TlsWant::kNothing;
  const int err = SSL_get_error(ssl, rc);
  if (err == SSL_ERROR_WANT_READ) return TlsWant::kRead;
  if (err == SSL_ERROR_WANT_WRITE) return TlsWant::kWrite;
  const long verify = SSL_get_verify_result(ssl);
  if (verify != X509_V_OK) {
    ERR_clear_error();
    return Status::PermissionDenied(std::string("TLS handshake: the server's certificate does "
                                                "not verify: ") +
                                    X509_verify_cert_error_string(verify) +
                                    "; check tls_ca_file and the name the node is reached by");
  }
  std::string detail = OpenSslErrors();
  if (err == SSL_ERROR_SYSCALL && detail == "no detail from OpenSSL") {
    detail = "the peer closed the connection (it may not speak TLS)";
  }
  return Status::Unavailable("TLS handshake failed: " + detail);
}

Result<size_t> TlsStream::Read(void* buf, size_t size, TlsWant* want) {
  SSL* ssl = Ssl(ssl_);
  *want = TlsWant::kNothing;
  ERR_clear_error();
  size_t got = 0;
  const int rc = SSL_read_ex(ssl, buf, size, &got);
  if (rc == 1) return got;
  bool closed = false;
  GRANARY_ASSIGN_OR_RETURN(*want, Classify(ssl, rc, "read", &closed));
  return size_t{0};
}

Result<size_t> TlsStream::Write(const void* buf, size_t size, TlsWant* want) {
  SSL* ssl = Ssl(ssl_);
  *want = TlsWant::kNothing;
  ERR_clear_error();
  size_t written = 0;
  const int rc = SSL_write_ex(ssl, buf, size, &written);
  if (rc == 1) return written;
  bool closed = false;
  GRANARY_ASSIGN_OR_RETURN(*want, Classify(ssl, rc, "write", &closed));
  if (closed) return Status::Unavailable("TLS write: the peer closed the connection");
  return size_t{0};
}

bool TlsStream::pending() const { return SSL_pending(Ssl(ssl_)) > 0; }

Result<std::array<uint8_t, 32>> TlsStream::ChannelBinding() const {
  static constexpr char kLabel[] = "EXPERIMENTAL-granary-auth";
  std::array<uint8_t, 32> out{};
  if (SSL_export_keying_material(Ssl(ssl_), out.data(), out.size(), kLabel, sizeof(kLabel) - 1,
                                 nullptr, 0, 0) != 1) {
    return Status::Internal("TLS: no keying material to bind to: " + OpenSslErrors());
  }
  return out;
}

void TlsStream::Shutdown() {
  ERR_clear_error();
  (void)SSL_shutdown(Ssl(ssl_));
  ERR_clear_error();
}

Status MakeSelfSignedCertificate(const std::string& cert_file, const std::string& key_file,
                                 const std::vector<std::string>& hosts, int days) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_RSA_gen(2048), EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
  if (key == nullptr || cert == nullptr) return Status::Internal("TLS: " + OpenSslErrors());
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 86400);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  const std::string cn = hosts.empty() ? std::string("granary") : hosts.front();
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  std::string alt;
  for (const std::string& h : hosts) {
    in6_addr probe{};
    const bool ip = ::inet_pton(AF_INET, h.c_str(), &probe) == 1 ||
                    ::inet_pton(AF_INET6, h.c_str(), &probe) == 1;
    alt += (alt.empty() ? "" : ",") + std::string(ip ? "IP:" : "DNS:") + h;
  }
  if (!alt.empty()) {
    X509V3_CTX v3;
    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, cert.get(), cert.get(), nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &v3, NID_subject_alt_name, alt.c_str());
    if (ext == nullptr) return Status::InvalidArgument("TLS: bad host names: " + alt);
    X509_add_ext(cert.get(), ext, -1);
    X509_EXTENSION_free(ext);
  }
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) {
    return Status::Internal("TLS: signing: " + OpenSslErrors());
  }
  auto write = [](const std::string& path, mode_t mode, auto&& put) -> Status {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
    if (bio == nullptr || put(bio.get()) != 1) return Status::Internal("TLS: " + OpenSslErrors());
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio.get(), &data);
    return WriteFileAtomically(path, std::string_view(data, static_cast<size_t>(n)), mode);
  };
  GRANARY_RETURN_IF_ERROR(write(key_file, 0600, [&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  }));
  return write(cert_file, 0644, [&](BIO* b) { return PEM_write_bio_X509(b, cert.get()); });
}

}  // namespace granary
