// The webhook's HTTPS endpoint and its certificate, in process: real TLS
// connections to a WebhookServer on 127.0.0.1, verified with the CA that
// MakeWebhookCert made (webhook_server.h, webhook_cert.h).

#include "granary/operator/webhook_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <mutex>
#include <string>

#include "granary/kube/base64.h"
#include "granary/operator/webhook_cert.h"

namespace granary::kube {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using ::testing::HasSubstr;

// --- certificates

X509* ParsePem(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  return cert;
}

// Whether `cert_pem` chains to `ca_pem` (with purpose serverAuth).
bool Verifies(const std::string& ca_pem, const std::string& cert_pem) {
  X509* ca = ParsePem(ca_pem);
  X509* cert = ParsePem(cert_pem);
  if (ca == nullptr || cert == nullptr) return false;
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, cert, nullptr);
  X509_STORE_CTX_set_purpose(ctx, X509_PURPOSE_SSL_SERVER);
  const bool ok = X509_verify_cert(ctx) == 1;
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  X509_free(cert);
  X509_free(ca);
  return ok;
}

TEST(WebhookCertTest, ServingCertChainsToTheCaWithTheServiceNamesAndIp) {
  WebhookCertRequest request;
  request.dns_names = ServiceDnsNames("granary-webhook", "granary");
  request.ip_addresses = {"127.0.0.1"};
  Result<WebhookCert> made = MakeWebhookCert(request);
  ASSERT_TRUE(made.ok()) << made.status().message();
  EXPECT_TRUE(Verifies(made->ca_pem, made->cert_pem));
  EXPECT_FALSE(Verifies(made->cert_pem, made->ca_pem));  // the leaf is no CA

  X509* cert = ParsePem(made->cert_pem);
  ASSERT_NE(cert, nullptr);
  for (const char* name :
       {"granary-webhook.granary.svc", "granary-webhook.granary.svc.cluster.local",
        "granary-webhook.granary", "granary-webhook"}) {
    EXPECT_EQ(X509_check_host(cert, name, 0, 0, nullptr), 1) << name;
  }
  EXPECT_NE(X509_check_host(cert, "evil.example.com", 0, 0, nullptr), 1);
  EXPECT_EQ(X509_check_ip_asc(cert, "127.0.0.1", 0), 1);
  EXPECT_NE(X509_check_ip_asc(cert, "10.0.0.1", 0), 1);
  X509_free(cert);

  // Another CA does not vouch for it.
  Result<WebhookCert> other = MakeWebhookCert(request);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(Verifies(other->ca_pem, made->cert_pem));
  EXPECT_THAT(made->key_pem, HasSubstr("BEGIN PRIVATE KEY"));
}

TEST(WebhookCertTest, BadRequestsAreErrors) {
  EXPECT_FALSE(MakeWebhookCert({}).ok());
  WebhookCertRequest bad_ip;
  bad_ip.ip_addresses = {"127.0.0.1,DNS:evil"};
  EXPECT_FALSE(MakeWebhookCert(bad_ip).ok());
  WebhookCertRequest bad_dns;
  bad_dns.dns_names = {"a,IP:1.2.3.4"};
  EXPECT_FALSE(MakeWebhookCert(bad_dns).ok());
}

// --- the server

struct Reply {
  int status = 0;
  std::string body;
};

// One HTTPS request to 127.0.0.1:port, verifying the server with `ca_pem`.
Result<Reply> Send(uint16_t port, const std::string& ca_pem, http::verb method,
                   const std::string& target, const std::string& body) {
  try {
    asio::io_context io;
    ssl::context tls(ssl::context::tls_client);
    tls.add_certificate_authority(asio::buffer(ca_pem));
    tls.set_verify_mode(ssl::verify_peer);
    beast::ssl_stream<beast::tcp_stream> stream(io, tls);
    X509_VERIFY_PARAM* param = SSL_get0_param(stream.native_handle());
    X509_VERIFY_PARAM_set1_ip_asc(param, "127.0.0.1");
    beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(10));
    beast::get_lowest_layer(stream).connect(
        tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    stream.handshake(ssl::stream_base::client);
    http::request<http::string_body> request(method, target, 11);
    request.set(http::field::host, "127.0.0.1");
    request.set(http::field::content_type, "application/json");
    request.body() = body;
    request.prepare_payload();
    http::write(stream, request);
    beast::flat_buffer buffer;
    http::response<http::string_body> response;
    http::read(stream, buffer, response);
    return Reply{static_cast<int>(response.result_int()), response.body()};
  } catch (const std::exception& e) {
    return Status::Unavailable(e.what());
  }
}

Json LabelledPod(const std::string& dataset) {
  return {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", "train"}, {"namespace", "team-a"}, {"labels", {{"granary.io/dataset", dataset}}}}},
      {"spec", {{"containers", Json::array({{{"name", "t"}, {"image", "pytorch"}}})}}}};
}

std::string Review(const Json& pod, const std::string& operation = "CREATE") {
  return Json({{"apiVersion", "admission.k8s.io/v1"},
               {"kind", "AdmissionReview"},
               {"request",
                {{"uid", "uid-1"},
                 {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                 {"namespace", "team-a"},
                 {"operation", operation},
                 {"object", pod}}}})
      .dump();
}

InjectionInputs Inputs(const std::string& name) {
  InjectionInputs in;
  in.dataset_namespace = "team-a";
  in.dataset_name = name;
  in.pool.name = "gpu";
  in.pool.node_selector = {{"granary.io/nvme", "true"}};
  in.store_secret_name = "granary-gpu-store";
  in.run_as_uid = 1000;
  in.run_as_gid = 1000;
  in.dataset_phase = "Ready";
  return in;
}

class WebhookServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WebhookCertRequest request;
    request.dns_names = {"localhost"};
    request.ip_addresses = {"127.0.0.1"};
    Result<WebhookCert> cert = MakeWebhookCert(request);
    ASSERT_TRUE(cert.ok()) << cert.status().message();
    cert_ = *cert;
    WebhookServerOptions options;
    options.cert_pem = cert_.cert_pem;
    options.key_pem = cert_.key_pem;
    options.operator_namespace = "granary";
    options.max_body_bytes = 64 * 1024;
    options.io_timeout = std::chrono::milliseconds(500);
    options.on_reply = [this](const MutateReply& reply) {
      std::lock_guard lock(mu_);
      outcomes_.push_back(reply.outcome + " " + reply.pod + (reply.message.empty() ? "" : ": ") +
                          reply.message);
    };
    Result<std::unique_ptr<WebhookServer>> server = WebhookServer::Start(
        options, [this](const std::string& ns, const std::string& name) -> Result<InjectionInputs> {
          ++lookups_;
          if (ns == "team-a" && (name == "imagenet" || name == "coco")) return Inputs(name);
          if (ns == "team-a" && name == "unreachable") {
            return Status::Unavailable("reading Dataset team-a/unreachable: connection refused");
          }
          if (ns == "team-a" && name == "other-pool") {
            InjectionInputs in = Inputs(name);
            in.pool.name = "cpu";
            return in;
          }
          return Status::NotFound("Dataset " + ns + "/" + name +
                                  " does not exist; create it or fix the pod's label");
        });
    ASSERT_TRUE(server.ok()) << server.status().message();
    server_ = std::move(*server);
    ASSERT_NE(server_->port(), 0);
  }

  Result<Reply> Post(const std::string& body) {
    return Send(server_->port(), cert_.ca_pem, http::verb::post, "/mutate", body);
  }

  std::vector<std::string> Outcomes() {
    std::lock_guard lock(mu_);
    return outcomes_;
  }

  WebhookCert cert_;
  std::atomic<int> lookups_{0};
  std::mutex mu_;
  std::vector<std::string> outcomes_;  // what on_reply saw, in order
  std::unique_ptr<WebhookServer> server_;
};

TEST_F(WebhookServerTest, LabelledPodGetsTheSidecarPatch) {
  Result<Reply> reply = Post(Review(LabelledPod("imagenet")));
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  ASSERT_EQ(reply->status, 200) << reply->body;
  const Json review = Json::parse(reply->body);
  EXPECT_EQ(review["kind"], "AdmissionReview");
  EXPECT_EQ(review["response"]["uid"], "uid-1");
  EXPECT_EQ(review["response"]["allowed"], true);
  EXPECT_EQ(review["response"]["patchType"], "JSONPatch");
  Result<std::string> patch = Base64Decode(review["response"]["patch"].get<std::string>(), "patch");
  ASSERT_TRUE(patch.ok());
  Result<Json> expected = BuildInjectionPatch(LabelledPod("imagenet"), Inputs("imagenet"));
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(Json::parse(*patch), *expected);
}

TEST_F(WebhookServerTest, TheApiServersTimeoutQueryIsAccepted) {
  Result<Reply> reply = Send(server_->port(), cert_.ca_pem, http::verb::post, "/mutate?timeout=5s",
                             Review(LabelledPod("imagenet")));
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(reply->status, 200) << reply->body;
  Result<Reply> other = Send(server_->port(), cert_.ca_pem, http::verb::post, "/mutatex?timeout=5s",
                             Review(LabelledPod("imagenet")));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->status, 404);
}

TEST_F(WebhookServerTest, UnknownDatasetIsRefusedWithTheReason) {
  Result<Reply> reply = Post(Review(LabelledPod("missing")));
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  ASSERT_EQ(reply->status, 200);
  const Json review = Json::parse(reply->body);
  EXPECT_EQ(review["response"]["allowed"], false);
  EXPECT_THAT(review["response"]["status"]["message"].get<std::string>(),
              HasSubstr("Dataset team-a/missing does not exist"));
}

// Several Datasets (annotation granary.io/datasets): one lookup each; one
// that does not exist, is in another pool or is not a name refuses the pod.
TEST_F(WebhookServerTest, SeveralDatasetsAreLookedUpEachAndRefusedWithTheReason) {
  const auto post = [&](const std::string& list) {
    Json pod = LabelledPod("imagenet");
    pod["metadata"]["annotations"] = {{"granary.io/datasets", list}};
    Result<Reply> reply = Post(Review(pod));
    EXPECT_TRUE(reply.ok()) << reply.status().message();
    return reply.ok() ? Json::parse(reply->body)["response"] : Json();
  };
  const Json both = post("imagenet, coco");
  EXPECT_EQ(both["allowed"], true);
  EXPECT_EQ(lookups_.load(), 2);
  Result<std::string> patch = Base64Decode(both["patch"].get<std::string>(), "patch");
  ASSERT_TRUE(patch.ok());
  EXPECT_THAT(*patch, HasSubstr("GRANARY_DATASETS"));
  EXPECT_THAT(*patch, HasSubstr(GranaryDatasetName("team-a", "coco")));

  const Json missing = post("coco,missing");
  EXPECT_EQ(missing["allowed"], false);
  EXPECT_THAT(missing["status"]["message"].get<std::string>(),
              HasSubstr("granary.io/datasets missing: Dataset team-a/missing does not exist"));
  const Json other_pool = post("other-pool");
  EXPECT_EQ(other_pool["allowed"], false);
  EXPECT_THAT(other_pool["status"]["message"].get<std::string>(), HasSubstr("is in CachePool cpu"));
  const Json bad = post("coco,Not_A_Name");
  EXPECT_EQ(bad["allowed"], false);
  EXPECT_THAT(bad["status"]["message"].get<std::string>(), HasSubstr("is not a Dataset name"));
}

// What the operator logs and counts (granary_operator_webhook_requests_total).
TEST_F(WebhookServerTest, EveryAnswerIsReportedWithItsOutcomeAndPod) {
  Json plain = LabelledPod("imagenet");
  plain["metadata"].erase("labels");
  for (const std::string& body :
       {Review(LabelledPod("imagenet")), Review(plain), Review(LabelledPod("missing")),
        std::string("{nope"), Review(LabelledPod("unreachable"))}) {
    Result<Reply> reply = Post(body);
    ASSERT_TRUE(reply.ok()) << reply.status().message();
  }
  const std::vector<std::string> seen = Outcomes();
  ASSERT_EQ(seen.size(), 5u) << ::testing::PrintToString(seen);
  EXPECT_THAT(seen[4], ::testing::StartsWith("lookup_error team-a/"));
  EXPECT_THAT(seen[0], ::testing::StartsWith("injected team-a/"));
  EXPECT_THAT(seen[1], ::testing::StartsWith("skipped team-a/"));
  EXPECT_THAT(seen[2], ::testing::StartsWith("refused team-a/"));
  EXPECT_THAT(seen[2], HasSubstr("Dataset team-a/missing does not exist"));
  EXPECT_THAT(seen[3], ::testing::StartsWith("bad_request"));
  EXPECT_THAT(seen[3], HasSubstr("not valid JSON"));
}

TEST_F(WebhookServerTest, UnlabelledPodsAndUpdatesAreAllowedUnchanged) {
  Json plain = LabelledPod("imagenet");
  plain["metadata"].erase("labels");
  for (const std::string& body : {Review(plain), Review(LabelledPod("imagenet"), "UPDATE")}) {
    Result<Reply> reply = Post(body);
    ASSERT_TRUE(reply.ok()) << reply.status().message();
    ASSERT_EQ(reply->status, 200);
    const Json review = Json::parse(reply->body);
    EXPECT_EQ(review["response"], Json({{"uid", "uid-1"}, {"allowed", true}}));
  }
  EXPECT_EQ(lookups_.load(), 0);
}

TEST_F(WebhookServerTest, BadRequestsGetErrorsAndTheServerKeepsServing) {
  Result<Reply> not_json = Post("{nope");
  ASSERT_TRUE(not_json.ok()) << not_json.status().message();
  EXPECT_EQ(not_json->status, 400);
  EXPECT_THAT(not_json->body, HasSubstr("not valid JSON"));

  Result<Reply> huge = Post(std::string(100 * 1024, ' '));
  ASSERT_TRUE(huge.ok()) << huge.status().message();
  EXPECT_EQ(huge->status, 413);

  Result<Reply> get = Send(server_->port(), cert_.ca_pem, http::verb::get, "/mutate", "");
  ASSERT_TRUE(get.ok());
  EXPECT_EQ(get->status, 405);
  Result<Reply> other = Send(server_->port(), cert_.ca_pem, http::verb::post, "/other", "{}");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->status, 404);

  // Plain bytes instead of TLS, and a client that connects and says nothing:
  // both closed, neither blocks the next request.
  asio::io_context io;
  tcp::socket garbage(io);
  garbage.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), server_->port()));
  asio::write(garbage, asio::buffer(std::string("GET / HTTP/1.1\r\n\r\n")));
  tcp::socket idle(io);
  idle.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), server_->port()));

  Result<Reply> still = Post(Review(LabelledPod("imagenet")));
  ASSERT_TRUE(still.ok()) << still.status().message();
  EXPECT_EQ(still->status, 200);

  // The idle connection is closed by the server's timeout (500 ms here).
  char byte;
  beast::error_code ec;
  const auto start = std::chrono::steady_clock::now();
  idle.read_some(asio::buffer(&byte, 1), ec);  // blocks until the server closes
  EXPECT_TRUE(ec == asio::error::eof || ec == asio::error::connection_reset) << ec.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(WebhookServerTest, AClientWithAnotherCaRefusesTheServer) {
  WebhookCertRequest request;
  request.ip_addresses = {"127.0.0.1"};
  Result<WebhookCert> other = MakeWebhookCert(request);
  ASSERT_TRUE(other.ok());
  Result<Reply> reply = Send(server_->port(), other->ca_pem, http::verb::post, "/mutate",
                             Review(LabelledPod("imagenet")));
  EXPECT_FALSE(reply.ok());
}

TEST_F(WebhookServerTest, StopClosesTheListenerAndOpenConnections) {
  // A connection open (TLS done, no request yet) when the server stops.
  asio::io_context io;
  ssl::context tls(ssl::context::tls_client);
  tls.add_certificate_authority(asio::buffer(cert_.ca_pem));
  tls.set_verify_mode(ssl::verify_peer);
  beast::ssl_stream<beast::tcp_stream> open(io, tls);
  beast::get_lowest_layer(open).connect(
      tcp::endpoint(asio::ip::make_address("127.0.0.1"), server_->port()));
  open.handshake(ssl::stream_base::client);

  const uint16_t port = server_->port();
  server_->Stop();
  EXPECT_EQ(server_->port(), port);
  const auto start = std::chrono::steady_clock::now();
  char byte;
  beast::error_code ec;
  beast::get_lowest_layer(open).expires_after(std::chrono::seconds(5));
  open.read_some(asio::buffer(&byte, 1), ec);
  EXPECT_TRUE(ec) << "the open connection is closed";
  EXPECT_NE(ec, beast::error::timeout);
  Result<Reply> after = Post(Review(LabelledPod("imagenet")));
  EXPECT_FALSE(after.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
}

TEST(WebhookServerStartTest, BadCertificateOrAddressIsAnError) {
  WebhookServerOptions options;
  options.cert_pem = "not a certificate";
  options.key_pem = "not a key";
  auto lookup = [](const std::string&, const std::string&) -> Result<InjectionInputs> {
    return Status::NotFound("none");
  };
  Result<std::unique_ptr<WebhookServer>> bad_cert = WebhookServer::Start(options, lookup);
  ASSERT_FALSE(bad_cert.ok());
  EXPECT_THAT(bad_cert.status().message(), HasSubstr("certificate"));

  WebhookCertRequest request;
  request.ip_addresses = {"127.0.0.1"};
  Result<WebhookCert> cert = MakeWebhookCert(request);
  ASSERT_TRUE(cert.ok());
  options.cert_pem = cert->cert_pem;
  options.key_pem = cert->key_pem;
  options.listen_host = "not-an-ip";
  EXPECT_FALSE(WebhookServer::Start(options, lookup).ok());
}

TEST(WebhookServerStartTest, CertificateCanComeLaterAndBeSwappedWhileServing) {
  WebhookCertRequest request;
  request.ip_addresses = {"127.0.0.1"};
  Result<WebhookCert> first = MakeWebhookCert(request);
  Result<WebhookCert> second = MakeWebhookCert(request);
  ASSERT_TRUE(first.ok() && second.ok());
  WebhookServerOptions options;  // no certificate yet
  options.operator_namespace = "granary";
  auto lookup = [](const std::string& ns, const std::string& name) -> Result<InjectionInputs> {
    if (name == "imagenet") return Inputs(name);
    return Status::NotFound("Dataset " + ns + "/" + name + " does not exist");
  };
  Result<std::unique_ptr<WebhookServer>> server = WebhookServer::Start(options, lookup);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_FALSE((*server)->has_certificate());
  const uint16_t port = (*server)->port();
  auto post = [&](const std::string& ca) {
    return Send(port, ca, http::verb::post, "/mutate", Review(LabelledPod("imagenet")));
  };
  EXPECT_FALSE(post(first->ca_pem).ok()) << "served without a certificate";

  ASSERT_TRUE((*server)->SetCertificate(first->cert_pem, first->key_pem).ok());
  EXPECT_TRUE((*server)->has_certificate());
  Result<Reply> with_first = post(first->ca_pem);
  ASSERT_TRUE(with_first.ok()) << with_first.status().ToString();
  EXPECT_EQ(with_first->status, 200);
  EXPECT_THAT(with_first->body, HasSubstr("JSONPatch"));

  // A renewal: the next connections get the new certificate; a client
  // trusting only the old CA no longer accepts the server.
  ASSERT_TRUE((*server)->SetCertificate(second->cert_pem, second->key_pem).ok());
  Result<Reply> with_second = post(second->ca_pem);
  ASSERT_TRUE(with_second.ok()) << with_second.status().ToString();
  EXPECT_EQ(with_second->status, 200);
  EXPECT_FALSE(post(first->ca_pem).ok());

  // Unusable material is refused and the current certificate kept.
  Status bad = (*server)->SetCertificate("not a certificate", second->key_pem);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("certificate"));
  Status mismatched = (*server)->SetCertificate(second->cert_pem, first->key_pem);
  EXPECT_EQ(mismatched.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(post(second->ca_pem).ok());
}

}  // namespace
}  // namespace granary::kube
