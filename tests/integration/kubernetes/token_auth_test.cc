// A pod's projected ServiceAccount token on a real cache node's TCP port,
// checked by the node with a real API server (TokenReview, cachenode
// token_review.h). Tokens come from TokenRequest (`kubectl create token`);
// the forged and expired ones are JWTs this test signs itself, with a key of
// its own and with the cluster's own service-account key. A token of
// namespace team-a reads team-a's datasets and nothing else; every refusal
// happens before any dataset byte.

#include <gmock/gmock.h>
#include <openssl/bn.h>
#include <openssl/ecdsa.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "granary/peer/peer_auth.h"
#include "testing/cachenode_fixture.h"
#include "testing/kube_cluster.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

// What kube_cluster.cc passes as --service-account-issuer.
constexpr char kIssuer[] = "https://kubernetes.default.svc.cluster.local";

std::string Base64Url(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()),
                                static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  while (!out.empty() && out.back() == '=') out.pop_back();
  for (char& c : out) {
    if (c == '+') c = '-';
    if (c == '/') c = '_';
  }
  return out;
}

using PKey = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;

PKey LoadKey(const std::string& pem_file) {
  const std::string pem = ReadAll(pem_file);
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  return PKey(key, EVP_PKEY_free);
}

PKey NewEcKey() { return PKey(EVP_EC_gen("P-256"), EVP_PKEY_free); }

// A JWT of `claims` signed with `key`: RS256 for an RSA key, ES256 for a
// P-256 key (the test cluster's service-account key is one).
std::string SignJwt(const json& claims, EVP_PKEY* key) {
  const bool ec = EVP_PKEY_get_base_id(key) == EVP_PKEY_EC;
  const std::string signing_input =
      Base64Url(json{{"alg", ec ? "ES256" : "RS256"}, {"typ", "JWT"}}.dump()) + "." +
      Base64Url(claims.dump());
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  size_t length = 0;
  EXPECT_EQ(EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, key), 1);
  EXPECT_EQ(EVP_DigestSign(ctx, nullptr, &length,
                           reinterpret_cast<const unsigned char*>(signing_input.data()),
                           signing_input.size()),
            1);
  std::string signature(length, '\0');
  EXPECT_EQ(EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(signature.data()), &length,
                           reinterpret_cast<const unsigned char*>(signing_input.data()),
                           signing_input.size()),
            1);
  EVP_MD_CTX_free(ctx);
  signature.resize(length);
  if (ec) {
    // JWS wants r || s, 32 bytes each, not OpenSSL's DER.
    const auto* der = reinterpret_cast<const unsigned char*>(signature.data());
    ECDSA_SIG* sig = d2i_ECDSA_SIG(nullptr, &der, static_cast<long>(signature.size()));
    EXPECT_NE(sig, nullptr);
    std::string raw(64, '\0');
    BN_bn2binpad(ECDSA_SIG_get0_r(sig), reinterpret_cast<unsigned char*>(raw.data()), 32);
    BN_bn2binpad(ECDSA_SIG_get0_s(sig), reinterpret_cast<unsigned char*>(raw.data()) + 32, 32);
    ECDSA_SIG_free(sig);
    signature = raw;
  }
  return signing_input + "." + Base64Url(signature);
}

class TokenAuthTest : public SharedKubeTest<TokenAuthTest> {
 public:
  static Status StartShared() {
    auto cluster = KubeCluster::Start();
    if (!cluster.ok()) return cluster.status().WithContext("control plane");
    kube_ = cluster->release();
    for (const char* ns : {"team-a", "team-b"}) {
      KubectlResult r = kube_->Kubectl({"create", "namespace", ns});
      KubectlResult sa = kube_->Kubectl({"create", "serviceaccount", "trainer", "-n", ns});
      if (!r.ok() || !sa.ok()) {
        return Status::Unavailable("namespaces: " + r.Describe() + sa.Describe());
      }
    }
    GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<CacheCluster> caches, CacheCluster::Create());
    cache_ = caches.release();
    // The node checks tokens with the API server, as the cluster's admin here
    // (in a pod: its ServiceAccount, allowed to create TokenReviews).
    CacheNodeOptions node;
    node.extra_yaml = "kubernetes_auth: " + kube_->kubeconfig_path() + "\n";
    GRANARY_RETURN_IF_ERROR(cache_->StartNodes(1, node));
    for (const char* ns : {"team-a", "team-b"}) {
      DatasetOptions o;
      o.name = std::string(ns) + "-images";
      o.files = 40;
      o.kubernetes_namespace = ns;
      GRANARY_ASSIGN_OR_RETURN(TestDataset ds, cache_->CreateDataset(o));
      datasets_->push_back(std::move(ds));
    }
    for (const TestDataset& ds : *datasets_) {
      GRANARY_RETURN_IF_ERROR(cache_->WaitForPhase(ds.name, DatasetPhase::kReady, 60s).status());
    }
    return Status::Ok();
  }
  static void StopShared() {
    delete cache_;
    delete kube_;
    cache_ = nullptr;
    kube_ = nullptr;
    datasets_->clear();
  }
  static void PrintLogsIfFailed() {
    if (kube_ != nullptr) kube_->PrintLogsIfTestFailed();
  }

 protected:
  // TokenRequest: a token of ServiceAccount trainer in `ns`.
  static std::string RequestToken(const std::string& ns, const std::string& audience) {
    KubectlResult r = kube_->Kubectl(
        {"create", "token", "trainer", "-n", ns, "--audience", audience, "--duration", "10m"});
    EXPECT_TRUE(r.ok()) << r.Describe();
    std::string token = r.out;
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
    return token;
  }

  // The claims the API server puts in a token of trainer in `ns`, valid
  // from now for `seconds` (negative: expired that long ago).
  static json Claims(const std::string& ns, int64_t seconds) {
    auto sa = kube_->GetJson({"serviceaccount", "trainer", "-n", ns});
    EXPECT_OK(sa);
    const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    const int64_t start = seconds > 0 ? now : now + seconds - 600;
    return {
        {"iss", kIssuer},
        {"sub", "system:serviceaccount:" + ns + ":trainer"},
        {"aud", json::array({"granary"})},
        {"iat", start},
        {"nbf", start},
        {"exp", now + seconds},
        {"kubernetes.io",
         {{"namespace", ns},
          {"serviceaccount",
           {{"name", "trainer"}, {"uid", sa.ok() ? (*sa)["metadata"].value("uid", "") : ""}}}}}};
  }

  // A reader of `ds` presenting `token`.
  static DatasetReader ReaderWith(const TestDataset& ds, const std::string& token,
                                  const std::string& file) {
    cache_->dir().WriteFile(file, token + "\n");
    DatasetReader reader(&cache_->store(), ds);
    ClientCredentials c;
    c.token_file = cache_->dir().Join(file);
    reader.SetCredentials(c);
    return reader;
  }

  // How many outcomes hold the snapshot's bytes; the first failure is reported.
  static size_t Exact(const std::vector<DatasetReader::Outcome>& got, const TestDataset& ds) {
    size_t n = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const bool exact = got[i].status.ok() && got[i].bytes == ds.contents[i];
      if (!exact && n == i) ADD_FAILURE() << "sample " << i << ": " << got[i].status.ToString();
      n += exact ? 1 : 0;
    }
    return n;
  }

  static void ExpectRefused(const std::vector<DatasetReader::Outcome>& got,
                            const std::string& text) {
    for (const DatasetReader::Outcome& o : got) {
      ASSERT_EQ(o.status.code(), StatusCode::kPermissionDenied) << o.status.ToString();
      ASSERT_THAT(o.status.message(), HasSubstr(text));
      ASSERT_TRUE(o.bytes.empty());
    }
  }

  static const TestDataset& TeamA() { return datasets_->at(0); }
  static const TestDataset& TeamB() { return datasets_->at(1); }

  static inline KubeCluster* kube_ = nullptr;
  static inline CacheCluster* cache_ = nullptr;
  static inline std::vector<TestDataset>* datasets_ = new std::vector<TestDataset>();
};

TEST_F(TokenAuthTest, ATokenReadsItsNamespacesDatasetsAndNoOther) {
  const std::string token = RequestToken("team-a", "granary");
  DatasetReader own = ReaderWith(TeamA(), token, "a.token");
  EXPECT_EQ(Exact(own.Read(TeamA().AllIds()), TeamA()), TeamA().contents.size());
  // The same token, team-b's dataset: refused per request, same connection.
  DatasetReader other = ReaderWith(TeamB(), token, "a2.token");
  ExpectRefused(other.Read(TeamB().AllIds()), "not readable as namespace/team-a");
  // team-b's own token reads it.
  DatasetReader b = ReaderWith(TeamB(), RequestToken("team-b", "granary"), "b.token");
  EXPECT_EQ(Exact(b.Read(TeamB().AllIds()), TeamB()), TeamB().contents.size());
}

TEST_F(TokenAuthTest, AWrongAudienceAForgedAndAnExpiredTokenAreRefusedAtConnect) {
  DatasetReader wrong_audience = ReaderWith(TeamA(), RequestToken("team-a", "vault"), "aud.token");
  ExpectRefused(wrong_audience.Read({0, 1}), "did not accept the token");

  // Signed like the cluster's tokens, but with a key of our own.
  PKey ours = NewEcKey();
  ASSERT_NE(ours, nullptr);
  DatasetReader forged =
      ReaderWith(TeamA(), SignJwt(Claims("team-a", 600), ours.get()), "forged.token");
  ExpectRefused(forged.Read({0, 1}), "did not accept the token");

  // With the cluster's own signing key: valid while it lasts (which shows the
  // tokens below are refused for what they say, not for how they are made)...
  PKey cluster_key = LoadKey(kube_->dir() + "/pki/sa.key");
  ASSERT_NE(cluster_key, nullptr);
  DatasetReader signed_ok =
      ReaderWith(TeamA(), SignJwt(Claims("team-a", 600), cluster_key.get()), "ok.token");
  EXPECT_EQ(Exact(signed_ok.Read(TeamA().AllIds()), TeamA()), TeamA().contents.size());
  // ...and refused once expired.
  DatasetReader expired =
      ReaderWith(TeamA(), SignJwt(Claims("team-a", -60), cluster_key.get()), "expired.token");
  ExpectRefused(expired.Read({0, 1}), "did not accept the token");

  // Garbage, and a token of a user that is not a ServiceAccount.
  DatasetReader garbage = ReaderWith(TeamA(), "not-a-token", "garbage.token");
  ExpectRefused(garbage.Read({0}), "did not accept the token");
}

}  // namespace
}  // namespace granary::testing
