#include "granary/operator/webhook_cert.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <ctime>
#include <memory>
#include <string>

namespace granary::kube {
namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
  void operator()(GENERAL_NAMES* p) const { GENERAL_NAMES_free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Free>;
using Cert = std::unique_ptr<X509, Free>;
using Bio = std::unique_ptr<BIO, Free>;

Status OpenSslError(const std::string& what) {
  std::string message = "making the webhook certificate: " + what + " failed";
  char buffer[256];
  while (unsigned long code = ERR_get_error()) {
    ERR_error_string_n(code, buffer, sizeof(buffer));
    message += std::string("; ") + buffer;
  }
  return Status::Internal(message);
}

Result<Key> NewKey() {
  Key key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslError("generating a P-256 key");
  return key;
}

Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, Free> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (!ext) return OpenSslError("building extension " + std::string(OBJ_nid2sn(nid)) + "=" + value);
  if (X509_add_ext(cert, ext.get(), -1) != 1) return OpenSslError("adding an extension");
  return Status::Ok();
}

// `issuer` null: self-signed (the CA).
Result<Cert> NewCert(EVP_PKEY* key, const std::string& common_name, X509* issuer,
                     std::chrono::seconds validity) {
  Cert cert(X509_new());
  if (!cert) return OpenSslError("X509_new");
  if (X509_set_version(cert.get(), 2) != 1) return OpenSslError("setting the version");
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return OpenSslError("drawing a serial");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  if (bn == nullptr) return OpenSslError("BN_bin2bn");
  ASN1_INTEGER* asn1_serial = BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  if (asn1_serial == nullptr) return OpenSslError("setting the serial");
  // Valid from an hour ago (clock skew between the operator and the API server).
  if (X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()),
                      static_cast<long>(std::chrono::seconds(validity).count())) == nullptr) {
    return OpenSslError("setting the validity");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                 -1, 0) != 1) {
    return OpenSslError("setting the subject");
  }
  X509* signer = issuer != nullptr ? issuer : cert.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) != 1) {
    return OpenSslError("setting the issuer");
  }
  if (X509_set_pubkey(cert.get(), key) != 1) return OpenSslError("setting the public key");
  GRANARY_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_subject_key_identifier, "hash"));
  return cert;
}

Result<std::string> CertPem(X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) return OpenSslError("writing a PEM");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

Result<std::string> KeyPem(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio ||
      PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return OpenSslError("writing the key PEM");
  }
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

bool IsIpAddress(const std::string& text) {
  ASN1_OCTET_STRING* ip = a2i_IPADDRESS(text.c_str());
  if (ip == nullptr) return false;
  ASN1_OCTET_STRING_free(ip);
  return true;
}

Result<std::chrono::system_clock::time_point> TimeOf(const ASN1_TIME* t, const char* which) {
  std::tm tm{};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) {
    return Status::InvalidArgument("the serving certificate's " + std::string(which) +
                                   " date cannot be read");
  }
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

Bio ReadBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

}  // namespace

Result<WebhookCertInfo> InspectWebhookCert(const WebhookCert& cert) {
  Bio cert_bio = ReadBio(cert.cert_pem);
  Cert leaf(cert_bio ? PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  ERR_clear_error();
  if (!leaf) return Status::InvalidArgument("tls.crt holds no PEM certificate");
  Bio key_bio = ReadBio(cert.key_pem);
  Key key(key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  ERR_clear_error();
  if (!key) return Status::InvalidArgument("tls.key holds no PEM private key");
  if (X509_check_private_key(leaf.get(), key.get()) != 1) {
    ERR_clear_error();
    return Status::InvalidArgument("tls.key is not the key of the certificate in tls.crt");
  }
  WebhookCertInfo info;
  Bio ca_bio = ReadBio(cert.ca_pem);
  while (ca_bio) {
    Cert ca(PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr));
    if (!ca) break;
    if (X509_check_issued(ca.get(), leaf.get()) == X509_V_OK &&
        X509_verify(leaf.get(), X509_get0_pubkey(ca.get())) == 1) {
      GRANARY_ASSIGN_OR_RETURN(info.issuer_pem, CertPem(ca.get()));
      break;
    }
  }
  ERR_clear_error();
  if (info.issuer_pem.empty()) {
    return Status::InvalidArgument("no certificate in ca.crt signed the certificate in tls.crt");
  }
  GRANARY_ASSIGN_OR_RETURN(info.not_before, TimeOf(X509_get0_notBefore(leaf.get()), "notBefore"));
  GRANARY_ASSIGN_OR_RETURN(info.not_after, TimeOf(X509_get0_notAfter(leaf.get()), "notAfter"));
  std::unique_ptr<GENERAL_NAMES, Free> names(static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(leaf.get(), NID_subject_alt_name, nullptr, nullptr)));
  for (int i = 0; names && i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
    if (name->type == GEN_DNS) {
      const ASN1_STRING* dns = name->d.dNSName;
      info.dns_names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
                                  static_cast<size_t>(ASN1_STRING_length(dns)));
    } else if (name->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* ip = name->d.iPAddress;
      const int length = ASN1_STRING_length(ip);
      char text[INET6_ADDRSTRLEN] = {};
      if ((length == 4 || length == 16) &&
          inet_ntop(length == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(ip), text,
                    sizeof(text)) != nullptr) {
        info.ip_addresses.emplace_back(text);
      }
    }
  }
  return info;
}

std::vector<std::string> ServiceDnsNames(const std::string& service, const std::string& ns) {
  return {service, service + "." + ns, service + "." + ns + ".svc",
          service + "." + ns + ".svc.cluster.local"};
}

Result<WebhookCert> MakeWebhookCert(const WebhookCertRequest& request) {
  if (request.dns_names.empty() && request.ip_addresses.empty()) {
    return Status::InvalidArgument(
        "making the webhook certificate: no DNS name and no IP address to certify");
  }
  std::string san;
  for (const std::string& dns : request.dns_names) {
    if (dns.empty() || dns.find_first_of(",:\n ") != std::string::npos) {
      return Status::InvalidArgument("making the webhook certificate: bad DNS name \"" + dns +
                                     "\"");
    }
    san += (san.empty() ? "" : ",") + std::string("DNS:") + dns;
  }
  for (const std::string& ip : request.ip_addresses) {
    if (ip.find(',') != std::string::npos || !IsIpAddress(ip)) {
      return Status::InvalidArgument("making the webhook certificate: \"" + ip +
                                     "\" is not an IP address");
    }
    san += (san.empty() ? "" : ",") + std::string("IP:") + ip;
  }

  GRANARY_ASSIGN_OR_RETURN(Key ca_key, NewKey());
  GRANARY_ASSIGN_OR_RETURN(
      Cert ca, NewCert(ca_key.get(), request.common_name + "-ca", nullptr, request.validity));
  GRANARY_RETURN_IF_ERROR(
      AddExtension(ca.get(), ca.get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
  GRANARY_RETURN_IF_ERROR(
      AddExtension(ca.get(), ca.get(), NID_key_usage, "critical,keyCertSign,cRLSign"));
  if (X509_sign(ca.get(), ca_key.get(), EVP_sha256()) == 0) return OpenSslError("signing the CA");

  GRANARY_ASSIGN_OR_RETURN(Key key, NewKey());
  GRANARY_ASSIGN_OR_RETURN(Cert cert,
                           NewCert(key.get(), request.common_name, ca.get(), request.validity));
  GRANARY_RETURN_IF_ERROR(AddExtension(cert.get(), ca.get(), NID_basic_constraints, "CA:FALSE"));
  GRANARY_RETURN_IF_ERROR(
      AddExtension(cert.get(), ca.get(), NID_key_usage, "critical,digitalSignature"));
  GRANARY_RETURN_IF_ERROR(AddExtension(cert.get(), ca.get(), NID_ext_key_usage, "serverAuth"));
  GRANARY_RETURN_IF_ERROR(AddExtension(cert.get(), ca.get(), NID_subject_alt_name, san));
  GRANARY_RETURN_IF_ERROR(
      AddExtension(cert.get(), ca.get(), NID_authority_key_identifier, "keyid:always"));
  if (X509_sign(cert.get(), ca_key.get(), EVP_sha256()) == 0) {
    return OpenSslError("signing the serving certificate");
  }

  WebhookCert out;
  GRANARY_ASSIGN_OR_RETURN(out.ca_pem, CertPem(ca.get()));
  GRANARY_ASSIGN_OR_RETURN(out.cert_pem, CertPem(cert.get()));
  GRANARY_ASSIGN_OR_RETURN(out.key_pem, KeyPem(key.get()));
  return out;
}

}  // namespace granary::kube
