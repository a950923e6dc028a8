// The Kubernetes REST client's transport: Boost.Beast over OpenSSL. Each
// request runs on an io_context of its own (the caller's thread), with the
// tcp_stream's timer bounding every step, so a dead API server costs a
// time-out, never a hung reconciler.

#include "granary/kube/kube_client.h"

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "granary/core/names.h"

namespace granary::kube {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Stream = beast::ssl_stream<beast::tcp_stream>;

// Runs the io_context until the operation started before it has completed.
void RunUntilDone(asio::io_context& ioc) {
  ioc.restart();
  ioc.run();
}

std::string ApiMessage(const std::string& body) {
  Json j = Json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) {
    return j["message"].get<std::string>();
  }
  if (body.size() > 300) return body.substr(0, 300) + "...";
  return body;
}

std::string ErrorText(const beast::error_code& ec) {
  if (ec == beast::error::timeout) return "timed out";
  return ec.message();
}

}  // namespace

std::string UrlEncode(const std::string& value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char ch : value) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) != 0 || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

class KubeClient::Transport {
 public:
  explicit Transport(const KubeConfig& config) : config_(config), ctx_(ssl::context::tls_client) {}

  Status Init() {
    beast::error_code ec;
    ctx_.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                     ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
    if (config_.insecure_skip_verify) {
      ctx_.set_verify_mode(ssl::verify_none);
    } else {
      ctx_.set_verify_mode(ssl::verify_peer);
      if (config_.ca_pem.empty()) {
        ctx_.set_default_verify_paths(ec);
      } else {
        ctx_.add_certificate_authority(asio::buffer(config_.ca_pem), ec);
      }
      if (ec) {
        return Status::InvalidArgument("the API server's CA certificate: " + ec.message() +
                                       "; check certificate-authority in the kubeconfig");
      }
    }
    if (!config_.client_cert_pem.empty()) {
      ctx_.use_certificate_chain(asio::buffer(config_.client_cert_pem), ec);
      if (!ec) ctx_.use_private_key(asio::buffer(config_.client_key_pem), ssl::context::pem, ec);
      if (ec) {
        return Status::InvalidArgument("the client certificate or key: " + ec.message() +
                                       "; check client-certificate and client-key");
      }
    }
    return Status::Ok();
  }

  // Connects and completes the TLS handshake within `timeout`.
  Status Connect(asio::io_context& ioc, Stream& stream, std::chrono::milliseconds timeout) {
    beast::error_code ec;
    tcp::resolver resolver(ioc);
    const auto endpoints = resolver.resolve(config_.host, config_.port, ec);
    if (ec) {
      return Status::Unavailable("resolving the API server " + config_.Describe() + ": " +
                                 ec.message());
    }
    if (!config_.insecure_skip_verify) {
      stream.set_verify_callback(ssl::host_name_verification(config_.host));
    }
    beast::error_code not_address;
    (void)asio::ip::make_address(config_.host, not_address);
    if (not_address) {
      // SNI for names only. (SSL_set_tlsext_host_name is a macro with a C cast.)
      SSL_ctrl(stream.native_handle(), SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
               const_cast<char*>(config_.host.c_str()));
    }
    beast::get_lowest_layer(stream).expires_after(timeout);
    beast::get_lowest_layer(stream).async_connect(
        endpoints, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
    RunUntilDone(ioc);
    if (ec) {
      return Status::Unavailable("connecting to the API server " + config_.Describe() + ": " +
                                 ErrorText(ec));
    }
    stream.async_handshake(ssl::stream_base::client, [&](beast::error_code e) { ec = e; });
    RunUntilDone(ioc);
    if (ec) {
      return Status::Unavailable("TLS handshake with the API server " + config_.Describe() + ": " +
                                 ErrorText(ec) +
                                 " (check the CA and the server address in the kubeconfig)");
    }
    return Status::Ok();
  }

  Result<std::string> Token() const {
    if (!config_.token_file.empty()) {
      std::ifstream in(config_.token_file);
      if (!in) {
        return Status::PermissionDenied("reading the token file " + Quoted(config_.token_file));
      }
      std::ostringstream s;
      s << in.rdbuf();
      std::string t = s.str();
      while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
      return t;
    }
    return config_.token;
  }

  Result<http::request<http::string_body>> MakeRequest(const std::string& method,
                                                       const std::string& path,
                                                       const std::string& body,
                                                       const std::string& content_type) {
    http::request<http::string_body> req;
    req.method_string(method);
    req.target(path);
    req.version(11);
    req.set(http::field::host, config_.host);
    req.set(http::field::user_agent, "granary-operator/0.1");
    req.set(http::field::accept, "application/json");
    GRANARY_ASSIGN_OR_RETURN(std::string token, Token());
    if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
    if (!body.empty() || method == "POST" || method == "PUT" || method == "PATCH") {
      req.set(http::field::content_type, content_type);
      req.body() = body;
      req.prepare_payload();
    }
    return req;
  }

  Result<KubeResponse> Request(const std::string& method, const std::string& path,
                               const std::string& body, const std::string& content_type,
                               std::chrono::milliseconds timeout) {
    asio::io_context ioc;
    Stream stream(ioc, ctx_);
    GRANARY_RETURN_IF_ERROR(Connect(ioc, stream, timeout));
    GRANARY_ASSIGN_OR_RETURN(auto req, MakeRequest(method, path, body, content_type));
    beast::error_code ec;
    beast::get_lowest_layer(stream).expires_after(timeout);
    http::async_write(stream, req, [&](beast::error_code e, size_t) { ec = e; });
    RunUntilDone(ioc);
    if (ec) return Status::Unavailable(method + " " + path + ": sending: " + ErrorText(ec));
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(256u << 20);
    http::async_read(stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
    RunUntilDone(ioc);
    if (ec == beast::error::timeout) {
      return Status::DeadlineExceeded(method + " " + path + ": no answer from " +
                                      config_.Describe() + " within " +
                                      std::to_string(timeout.count()) + " ms");
    }
    if (ec)
      return Status::Unavailable(method + " " + path + ": reading the answer: " + ErrorText(ec));
    KubeResponse out;
    out.status = static_cast<int>(parser.get().result_int());
    out.body = std::move(parser.get().body());
    beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(1));
    stream.async_shutdown([](beast::error_code) {});
    RunUntilDone(ioc);
    return out;
  }

  Status Watch(const std::string& path, const std::function<bool(const Json&)>& on_event,
               const std::atomic<bool>& stop, std::chrono::milliseconds poll) {
    asio::io_context ioc;
    Stream stream(ioc, ctx_);
    GRANARY_RETURN_IF_ERROR(Connect(ioc, stream, std::chrono::seconds(10)));
    GRANARY_ASSIGN_OR_RETURN(auto req, MakeRequest("GET", path, "", ""));
    beast::error_code ec;
    beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(10));
    http::async_write(stream, req, [&](beast::error_code e, size_t) { ec = e; });
    RunUntilDone(ioc);
    if (ec) return Status::Unavailable("watch " + path + ": sending: " + ErrorText(ec));

    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(boost::none);
    // A watch lasts until the server's timeoutSeconds; this bounds a dead peer.
    beast::get_lowest_layer(stream).expires_after(std::chrono::minutes(15));
    bool done = false;
    auto run_polling = [&]() -> bool {  // false: stopped
      ioc.restart();
      while (!done) {
        ioc.run_for(poll);
        if (!done && stop.load()) {
          beast::get_lowest_layer(stream).cancel();
          ioc.restart();
          ioc.run();
          return false;
        }
      }
      return true;
    };
    http::async_read_header(stream, buffer, parser, [&](beast::error_code e, size_t) {
      ec = e;
      done = true;
    });
    if (!run_polling()) return Status::Ok();
    if (ec) return Status::Unavailable("watch " + path + ": " + ErrorText(ec));
    const int code = static_cast<int>(parser.get().result_int());
    char chunk[1 << 16];
    // Reads what has arrived of the body into `chunk` (read_some: an event
    // is delivered as soon as its bytes arrive, not when the buffer is
    // full). Bytes read, 0 at the end of the stream, nullopt when stopped;
    // `ec` holds an error.
    auto read_some = [&]() -> std::optional<size_t> {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof(chunk);
      done = false;
      http::async_read_some(stream, buffer, parser, [&](beast::error_code e, size_t) {
        ec = e;
        done = true;
      });
      if (!run_polling()) return std::nullopt;
      if (ec == http::error::need_buffer) ec = {};
      return sizeof(chunk) - parser.get().body().size;
    };
    const auto at_end = [&] {
      return ec == http::error::end_of_stream || ec == asio::error::eof ||
             ec == ssl::error::stream_truncated;
    };
    if (code != 200) {
      // An error answer: read it whole for the message.
      std::string body;
      while (!parser.is_done() && body.size() < (1u << 20)) {
        const std::optional<size_t> n = read_some();
        if (!n) return Status::Ok();
        if (ec) break;
        body.append(chunk, *n);
      }
      return StatusOf({code, body}, "watch " + path);
    }
    std::string pending;
    while (!parser.is_done()) {
      const std::optional<size_t> n = read_some();
      if (!n) return Status::Ok();
      if (at_end()) break;
      if (ec) return Status::Unavailable("watch " + path + ": " + ErrorText(ec));
      pending.append(chunk, *n);
      size_t start = 0;
      for (size_t nl = pending.find('\n'); nl != std::string::npos;
           nl = pending.find('\n', start)) {
        const std::string_view line(pending.data() + start, nl - start);
        start = nl + 1;
        if (line.empty()) continue;
        Json event = Json::parse(line, nullptr, false);
        if (event.is_discarded() || !event.is_object()) {
          return Status::Corruption("watch " + path + ": an event that is not a JSON object");
        }
        if (!on_event(event)) return Status::Ok();
      }
      pending.erase(0, start);
      if (pending.size() > (64u << 20)) {
        return Status::ResourceExhausted("watch " + path + ": an event over 64 MiB");
      }
    }
    return Status::Ok();
  }

 private:
  KubeConfig config_;
  ssl::context ctx_;
};

KubeClient::KubeClient(KubeConfig config, std::unique_ptr<Transport> transport)
    : config_(std::move(config)), transport_(std::move(transport)) {}
KubeClient::~KubeClient() = default;

Result<std::unique_ptr<KubeClient>> KubeClient::Create(KubeConfig config) {
  auto transport = std::make_unique<Transport>(config);
  GRANARY_RETURN_IF_ERROR(transport->Init());
  return std::unique_ptr<KubeClient>(new KubeClient(std::move(config), std::move(transport)));
}

Result<KubeResponse> KubeClient::Request(const std::string& method, const std::string& path,
                                         const std::string& body, const std::string& content_type,
                                         std::chrono::milliseconds timeout) {
  Count(RequestKindOf(method, path));
  return transport_->Request(method, path, body, content_type, timeout);
}

RequestKind RequestKindOf(const std::string& method, const std::string& path) {
  const std::string::size_type q = path.find('?');
  const std::string query = q == std::string::npos ? "" : path.substr(q + 1);
  std::vector<std::string> parts;
  for (std::string::size_type i = 0, end; i < std::min(q, path.size()); i = end + 1) {
    end = std::min(path.find('/', i), std::min(q, path.size()));
    if (end > i) parts.push_back(path.substr(i, end - i));
  }
  // After /api/v1 or /apis/<group>/<version>: [namespaces/<ns>/]<resource>[/<name>[/<sub>]].
  size_t at = 0;
  if (parts.size() >= 2 && parts[0] == "api") {
    at = 2;
  } else if (parts.size() >= 3 && parts[0] == "apis") {
    at = 3;
  } else {
    return {method == "GET" ? "get" : method, "other"};
  }
  std::vector<std::string> rest(parts.begin() + static_cast<std::ptrdiff_t>(at), parts.end());
  // A namespaced path, unless it names the Namespace itself (namespaces/<ns>).
  if (rest.size() >= 3 && rest[0] == "namespaces") rest.erase(rest.begin(), rest.begin() + 2);
  if (rest.empty()) return {method == "GET" ? "get" : method, "other"};
  std::string resource = rest[0];
  if (rest.size() >= 3) resource += "/" + rest[2];
  const bool collection = rest.size() == 1;
  const bool watch = query == "watch=1" || query.rfind("watch=1&", 0) == 0 ||
                     query.find("&watch=1") != std::string::npos;
  std::string verb;
  if (method == "GET") {
    verb = watch ? "watch" : collection ? "list" : "get";
  } else if (method == "POST") {
    verb = "create";
  } else if (method == "PUT") {
    verb = "update";
  } else if (method == "PATCH") {
    verb = "patch";
  } else if (method == "DELETE") {
    verb = collection ? "deletecollection" : "delete";
  } else {
    verb = method;
  }
  return {verb, resource};
}

void KubeClient::Count(const RequestKind& kind) {
  std::lock_guard lock(counts_mu_);
  ++counts_[kind];
}

std::map<RequestKind, uint64_t> KubeClient::RequestCounts() const {
  std::lock_guard lock(counts_mu_);
  return counts_;
}

Status KubeClient::StatusOf(const KubeResponse& r, const std::string& what) {
  if (r.status >= 200 && r.status < 300) return Status::Ok();
  const std::string m = what + ": HTTP " + std::to_string(r.status) + ": " + ApiMessage(r.body);
  switch (r.status) {
    case 404:
      return Status::NotFound(m);
    case 409: {
      Json j = Json::parse(r.body, nullptr, false);
      const bool exists = j.is_object() && j.value("reason", "") == "AlreadyExists";
      return exists ? Status::AlreadyExists(m) : Status::FailedPrecondition(m);
    }
    case 410:
      return Status::OutOfRange(m);
    case 401:
    case 403:
      return Status::PermissionDenied(m);
    case 400:
    case 415:
    case 422:
      return Status::InvalidArgument(m);
    default:
      return Status::Unavailable(m);
  }
}

Result<Json> KubeClient::JsonCall(const std::string& method, const std::string& path,
                                  const std::string& body, const std::string& content_type,
                                  const std::string& what) {
  GRANARY_ASSIGN_OR_RETURN(KubeResponse r, Request(method, path, body, content_type));
  GRANARY_RETURN_IF_ERROR(StatusOf(r, what));
  if (r.body.empty()) return Json::object();
  Json j = Json::parse(r.body, nullptr, false);
  if (j.is_discarded()) return Status::Corruption(what + ": the API server's answer is not JSON");
  return j;
}

Result<Json> KubeClient::Get(const std::string& path) {
  return JsonCall("GET", path, "", "", "GET " + path);
}
Result<Json> KubeClient::Create(const std::string& collection_path, const Json& object) {
  return JsonCall("POST", collection_path, object.dump(), "application/json",
                  "POST " + collection_path);
}
Result<Json> KubeClient::Replace(const std::string& path, const Json& object) {
  return JsonCall("PUT", path, object.dump(), "application/json", "PUT " + path);
}
Result<Json> KubeClient::MergePatch(const std::string& path, const Json& patch) {
  return JsonCall("PATCH", path, patch.dump(), "application/merge-patch+json", "PATCH " + path);
}
Result<Json> KubeClient::Apply(const std::string& path, const Json& object,
                               const std::string& field_manager) {
  const std::string query = (path.find('?') == std::string::npos ? "?" : "&") +
                            std::string("fieldManager=") + UrlEncode(field_manager) + "&force=true";
  return JsonCall("PATCH", path + query, object.dump(), "application/apply-patch+yaml",
                  "apply " + path);
}
Status KubeClient::Delete(const std::string& path) {
  return JsonCall("DELETE", path, "", "", "DELETE " + path).status();
}

Status KubeClient::Watch(const std::string& path, const std::function<bool(const Json&)>& on_event,
                         const std::atomic<bool>& stop, std::chrono::milliseconds poll) {
  RequestKind kind = RequestKindOf("GET", path);
  kind.verb = "watch";
  Count(kind);
  return transport_->Watch(path, on_event, stop, poll);
}

}  // namespace granary::kube
