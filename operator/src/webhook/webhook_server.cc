#include "granary/operator/webhook_server.h"

#include <array>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "granary/core/thread_name.h"

namespace granary::kube {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

MutateReply HandleMutate(std::string_view body, const std::string& operator_namespace,
                         const InjectionLookup& lookup) {
  MutateReply reply;
  Result<AdmissionRequest> request = ParseAdmissionReview(body);
  if (!request.ok()) {
    reply.http_status = 400;
    reply.content_type = "text/plain";
    reply.body = request.status().message() + "\n";
    reply.outcome = "bad_request";
    reply.message = request.status().message();
    return reply;
  }
  {
    const Json* meta = request->pod.is_object() && request->pod.contains("metadata")
                           ? &request->pod["metadata"]
                           : nullptr;
    std::string name;
    if (meta != nullptr && meta->is_object()) {
      if (meta->contains("name") && (*meta)["name"].is_string()) {
        name = (*meta)["name"].get<std::string>();
      } else if (meta->contains("generateName") && (*meta)["generateName"].is_string()) {
        name = (*meta)["generateName"].get<std::string>() + "*";
      }
    }
    reply.pod = request->namespace_ + "/" + name;
  }
  const auto refuse = [&](int code, const std::string& message, const char* outcome) {
    reply.body = DenyResponse(request->uid, code, message);
    reply.outcome = outcome;
    reply.message = message;
  };
  const InjectionDecision decision = Decide(*request, operator_namespace);
  if (decision.kind != InjectionDecision::Kind::kInject) {
    reply.body = AllowResponse(request->uid);
    return reply;
  }
  if (AlreadyInjected(request->pod)) {
    reply.body = AllowResponse(request->uid);
    return reply;
  }
  Result<std::vector<std::string>> names = NamedDatasets(request->pod, decision.dataset);
  if (!names.ok()) {
    refuse(400, names.status().message(), "bad_request");
    return reply;
  }
  // A Dataset that is missing, being deleted or invalid is the user's to
  // fix ("refused"); anything else means the lookup itself failed (the API
  // server unreachable: "lookup_error", which an alert watches).
  const auto outcome_of = [](const Status& s) {
    const StatusCode c = s.code();
    return c == StatusCode::kNotFound || c == StatusCode::kFailedPrecondition ||
                   c == StatusCode::kInvalidArgument
               ? "refused"
               : "lookup_error";
  };
  Result<InjectionInputs> inputs = lookup(request->namespace_, decision.dataset);
  if (!inputs.ok()) {
    refuse(403, "granary.io/dataset=" + decision.dataset + ": " + inputs.status().message(),
           outcome_of(inputs.status()));
    return reply;
  }
  // Further Datasets (annotation granary.io/datasets): one lookup each.
  for (size_t i = 1; i < names->size(); ++i) {
    const std::string& name = (*names)[i];
    Result<InjectionInputs> other = lookup(request->namespace_, name);
    Status added = other.ok() ? AddDataset(*other, &*inputs) : other.status();
    if (!added.ok()) {
      refuse(403, std::string(kDatasetsAnnotation) + " " + name + ": " + added.message(),
             outcome_of(added));
      return reply;
    }
  }
  Result<Json> patch = BuildInjectionPatch(request->pod, *inputs);
  if (!patch.ok()) {
    // A Dataset without a snapshot, a view the pool forbids: refusals; a pod
    // that cannot be read: a bad request.
    const bool refusal = patch.status().code() == StatusCode::kFailedPrecondition;
    refuse(400,
           "granary.io/dataset=" + decision.dataset +
               ": cannot inject Granary's sidecar: " + patch.status().message(),
           refusal ? "refused" : "bad_request");
    return reply;
  }
  reply.body = PatchResponse(request->uid, *patch);
  reply.outcome = patch->empty() ? "skipped" : "injected";
  return reply;
}

struct WebhookServer::Impl {
  WebhookServerOptions options;
  InjectionLookup lookup;
  // Before io: sessions destroyed with the io_context decrement it.
  std::atomic<size_t> connections{0};
  // Reset by Stop, which destroys the sessions' handlers and so closes
  // their connections (Stop joins the thread first).
  std::optional<asio::io_context> io{std::in_place, 1};
  // Swapped whole by SetCertificate; each session keeps the one it started
  // with. Null: no certificate yet.
  mutable std::mutex tls_mu;
  std::shared_ptr<ssl::context> tls;      // guarded by tls_mu
  std::optional<tcp::acceptor> acceptor;  // emplaced by Start, reset by Stop
  uint16_t port = 0;
  std::thread thread;
  bool stopped = false;

  void Accept();
  std::shared_ptr<ssl::context> Tls() const {
    std::lock_guard lock(tls_mu);
    return tls;
  }
};

namespace {

Result<std::shared_ptr<ssl::context>> MakeServerTls(const std::string& cert_pem,
                                                    const std::string& key_pem) {
  auto tls = std::make_shared<ssl::context>(ssl::context::tls_server);
  beast::error_code ec;
  tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1,
                   ec);
  tls->use_certificate_chain(asio::buffer(cert_pem), ec);
  if (ec) {
    return Status::InvalidArgument("webhook server: the serving certificate is not usable PEM: " +
                                   ec.message());
  }
  tls->use_private_key(asio::buffer(key_pem), ssl::context::pem, ec);
  if (ec) {
    return Status::InvalidArgument("webhook server: the serving key is not usable PEM: " +
                                   ec.message());
  }
  if (SSL_CTX_check_private_key(tls->native_handle()) != 1) {
    return Status::InvalidArgument(
        "webhook server: the serving key is not the serving certificate's key");
  }
  return tls;
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<ssl::context> tls, WebhookServer::Impl* server)
      : tls_(std::move(tls)), stream_(std::move(socket), *tls_), server_(server) {
    server_->connections.fetch_add(1);
  }
  ~Session() { server_->connections.fetch_sub(1); }

  void Run() {
    beast::get_lowest_layer(stream_).expires_after(server_->options.io_timeout);
    stream_.async_handshake(ssl::stream_base::server,
                            [self = shared_from_this()](beast::error_code ec) {
                              if (!ec) self->Read();
                            });
  }

 private:
  void Read() {
    parser_.emplace();
    parser_->body_limit(server_->options.max_body_bytes);
    parser_->header_limit(16 * 1024);
    beast::get_lowest_layer(stream_).expires_after(server_->options.io_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream) return Close();
    if (ec == http::error::body_limit) {
      // Read (and drop) what the client is still sending before closing:
      // closing with unread bytes resets the connection, and the client
      // would lose the 413.
      drain_after_reply_ = true;
      return Reply(413, "text/plain",
                   "AdmissionReview body larger than " +
                       std::to_string(server_->options.max_body_bytes) + " bytes\n",
                   false);
    }
    if (ec) {
      // Garbage on the wire, a timeout, a reset: a 400 where HTTP still
      // allows one, else just close.
      if (ec.category() == beast::error_code(http::error::bad_target).category()) {
        return Reply(400, "text/plain", "bad HTTP request: " + ec.message() + "\n", false);
      }
      return;
    }
    const auto& request = parser_->get();
    const bool keep_alive = request.keep_alive();
    // The API server appends ?timeout=<n>s to the URL it was given.
    const std::string_view target(request.target().data(), request.target().size());
    if (target.substr(0, target.find('?')) != "/mutate") {
      return Reply(404, "text/plain", "not found: POST an AdmissionReview to /mutate\n",
                   keep_alive);
    }
    if (request.method() != http::verb::post) {
      return Reply(405, "text/plain", "POST an AdmissionReview to /mutate\n", keep_alive);
    }
    MutateReply reply;
    try {
      reply = HandleMutate(request.body(), server_->options.operator_namespace, server_->lookup);
    } catch (const std::exception& e) {
      // The lookup is the caller's code; nothing of ours throws here.
      reply = MutateReply();
      reply.http_status = 500;
      reply.content_type = "text/plain";
      reply.body = std::string("webhook error: ") + e.what() + "\n";
      reply.outcome = "error";
      reply.message = e.what();
    }
    if (server_->options.on_reply) server_->options.on_reply(reply);
    Reply(reply.http_status, reply.content_type, std::move(reply.body), keep_alive);
  }

  void Reply(int status, const std::string& content_type, std::string body, bool keep_alive) {
    auto response =
        std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
    response->set(http::field::content_type, content_type);
    response->keep_alive(keep_alive);
    response->body() = std::move(body);
    response->prepare_payload();
    beast::get_lowest_layer(stream_).expires_after(server_->options.io_timeout);
    http::async_write(
        stream_, *response,
        [self = shared_from_this(), response, keep_alive](beast::error_code ec, size_t) {
          if (ec) return;
          if (keep_alive) {
            self->Read();
          } else if (self->drain_after_reply_) {
            self->Drain(0);
          } else {
            self->Close();
          }
        });
  }

  // Discards incoming bytes until the client closes, a bound of twice the
  // body limit, or the timeout (set once, not renewed).
  void Drain(size_t drained) {
    if (drained == 0) {
      beast::get_lowest_layer(stream_).expires_after(server_->options.io_timeout);
    }
    if (drained > 2 * server_->options.max_body_bytes) return Close();
    stream_.async_read_some(asio::buffer(drain_buffer_),
                            [self = shared_from_this(), drained](beast::error_code ec, size_t n) {
                              if (ec) return self->Close();
                              self->Drain(drained + n);
                            });
  }

  void Close() {
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(1));
    stream_.async_shutdown([self = shared_from_this()](beast::error_code) {
      beast::error_code ignored;
      beast::get_lowest_layer(self->stream_).socket().close(ignored);
    });
  }

  std::shared_ptr<ssl::context> tls_;  // before stream_, which uses it
  beast::ssl_stream<beast::tcp_stream> stream_;
  WebhookServer::Impl* server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool drain_after_reply_ = false;
  std::array<char, 16384> drain_buffer_{};
};

}  // namespace

void WebhookServer::Impl::Accept() {
  acceptor->async_accept(asio::make_strand(*io), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
    if (!ec) {
      std::shared_ptr<ssl::context> context = Tls();
      if (connections.load() >= options.max_connections || !context) {
        beast::error_code ignored;
        socket.close(ignored);
      } else {
        std::make_shared<Session>(std::move(socket), std::move(context), this)->Run();
      }
    }
    Accept();
  });
}

Result<std::unique_ptr<WebhookServer>> WebhookServer::Start(WebhookServerOptions options,
                                                            InjectionLookup lookup) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->lookup = std::move(lookup);
  const WebhookServerOptions& o = impl->options;
  beast::error_code ec;
  if (!o.cert_pem.empty() || !o.key_pem.empty()) {
    GRANARY_ASSIGN_OR_RETURN(impl->tls, MakeServerTls(o.cert_pem, o.key_pem));
  }
  const asio::ip::address address = asio::ip::make_address(o.listen_host, ec);
  if (ec) {
    return Status::InvalidArgument("webhook server: listen address \"" + o.listen_host +
                                   "\" is not an IP address");
  }
  const tcp::endpoint endpoint(address, o.listen_port);
  impl->acceptor.emplace(*impl->io);
  impl->acceptor->open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor->bind(endpoint, ec);
  if (!ec) impl->acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::Unavailable("webhook server: cannot listen on " + o.listen_host + ":" +
                               std::to_string(o.listen_port) + ": " + ec.message() +
                               " (choose another --webhook-listen)");
  }
  impl->port = impl->acceptor->local_endpoint(ec).port();
  if (ec)
    return Status::Unavailable("webhook server: the listener has no address: " + ec.message());
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    NameThisThread("webhook");
    raw->io->run();
  });
  return std::unique_ptr<WebhookServer>(new WebhookServer(std::move(impl)));
}

WebhookServer::WebhookServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WebhookServer::~WebhookServer() { Stop(); }

uint16_t WebhookServer::port() const { return impl_->port; }

Status WebhookServer::SetCertificate(const std::string& cert_pem, const std::string& key_pem) {
  GRANARY_ASSIGN_OR_RETURN(std::shared_ptr<ssl::context> tls, MakeServerTls(cert_pem, key_pem));
  std::lock_guard lock(impl_->tls_mu);
  impl_->tls = std::move(tls);
  return Status::Ok();
}

bool WebhookServer::has_certificate() const { return impl_->Tls() != nullptr; }

void WebhookServer::Stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->io->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  // The loop no longer runs: close the listener, then destroy the pending
  // handlers, which own the sessions (their connections close with them).
  impl_->acceptor.reset();
  impl_->io.reset();
}

}  // namespace granary::kube
