#include "granary/kube/kube_config.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "granary/core/names.h"
#include "granary/kube/base64.h"

namespace granary::kube {
namespace {

Result<std::string> ReadWholeFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::NotFound(what + " " + Quoted(path) + " cannot be read; check the path");
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Resolve(const std::string& dir, const std::string& file) {
  if (file.empty() || file[0] == '/') return file;
  return dir + "/" + file;
}

// Finds the entry `name` of a kubeconfig list (clusters, users, contexts).
YAML::Node Named(const YAML::Node& list, const std::string& name) {
  if (!list.IsSequence()) return YAML::Node();
  for (const YAML::Node& entry : list) {
    if (entry["name"] && entry["name"].as<std::string>() == name) return entry;
  }
  return YAML::Node();
}

std::string Text(const YAML::Node& node, const char* key) {
  const YAML::Node v = node[key];
  return v && v.IsScalar() ? v.as<std::string>() : std::string();
}

// Either `key-data` (base64) or `key` (a file relative to the kubeconfig).
Result<std::string> DataOrFile(const YAML::Node& node, const std::string& key,
                               const std::string& dir, const std::string& where) {
  const std::string data = Text(node, (key + "-data").c_str());
  if (!data.empty()) return Base64Decode(data, where + " " + key + "-data");
  const std::string file = Text(node, key.c_str());
  if (file.empty()) return std::string();
  return ReadWholeFile(Resolve(dir, file), where + " " + key);
}

}  // namespace

std::string KubeConfig::Describe() const {
  const bool v6 = host.find(':') != std::string::npos;
  return "https://" + (v6 ? "[" + host + "]" : host) + ":" + port;
}

Status ParseServerUrl(const std::string& server, KubeConfig* config) {
  std::string rest = server;
  if (rest.rfind("https://", 0) == 0) {
    rest = rest.substr(8);
  } else if (rest.find("://") != std::string::npos) {
    return Status::InvalidArgument("server " + Quoted(server) +
                                   ": only https:// API servers are supported");
  }
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) {
    return Status::InvalidArgument("server " + Quoted(server) +
                                   ": a path after the address is not supported");
  }
  std::string host = rest;
  std::string port = "443";
  if (!rest.empty() && rest[0] == '[') {
    const size_t close = rest.find(']');
    if (close == std::string::npos) {
      return Status::InvalidArgument("server " + Quoted(server) + ": unclosed '[' in the address");
    }
    host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') {
        return Status::InvalidArgument("server " + Quoted(server) + ": expected ':' after ']'");
      }
      port = rest.substr(close + 2);
    }
  } else if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty() || port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
      port.size() > 5 || std::stoul(port) == 0 || std::stoul(port) > 65535) {
    return Status::InvalidArgument("server " + Quoted(server) +
                                   ": write https://HOST:PORT, e.g. https://10.0.0.1:6443");
  }
  config->host = host;
  config->port = port;
  return Status::Ok();
}

Result<KubeConfig> LoadKubeConfig(const std::string& path_in, const std::string& context_name) {
  std::string path = path_in;
  if (path.empty()) {
    if (const char* env = std::getenv("KUBECONFIG"); env != nullptr && *env != '\0') {
      path = env;
      if (const size_t colon = path.find(':'); colon != std::string::npos) path.resize(colon);
    } else if (const char* home = std::getenv("HOME"); home != nullptr) {
      path = std::string(home) + "/.kube/config";
    }
  }
  GRANARY_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, "kubeconfig"));
  const std::string dir =
      path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument("kubeconfig " + Quoted(path) + ": " + e.what());
  }
  if (!root.IsMap()) {
    return Status::InvalidArgument("kubeconfig " + Quoted(path) + " is not a YAML mapping");
  }
  const std::string ctx_name = context_name.empty() ? Text(root, "current-context") : context_name;
  if (ctx_name.empty()) {
    return Status::InvalidArgument("kubeconfig " + Quoted(path) +
                                   " has no current-context; pass a context name");
  }
  const YAML::Node ctx = Named(root["contexts"], ctx_name)["context"];
  if (!ctx) {
    return Status::NotFound("kubeconfig " + Quoted(path) + ": no context " + Quoted(ctx_name));
  }
  const std::string cluster_name = Text(ctx, "cluster");
  const std::string user_name = Text(ctx, "user");
  const YAML::Node cluster = Named(root["clusters"], cluster_name)["cluster"];
  if (!cluster) {
    return Status::NotFound("kubeconfig " + Quoted(path) + ": context " + Quoted(ctx_name) +
                            " names cluster " + Quoted(cluster_name) + ", which is not defined");
  }
  KubeConfig config;
  config.namespace_ = Text(ctx, "namespace");
  GRANARY_RETURN_IF_ERROR(
      ParseServerUrl(Text(cluster, "server"), &config).WithContext("kubeconfig " + Quoted(path)));
  const std::string where = "kubeconfig " + Quoted(path);
  GRANARY_ASSIGN_OR_RETURN(config.ca_pem, DataOrFile(cluster, "certificate-authority", dir, where));
  config.insecure_skip_verify = Text(cluster, "insecure-skip-tls-verify") == "true";
  if (!user_name.empty()) {
    const YAML::Node user = Named(root["users"], user_name)["user"];
    if (!user) {
      return Status::NotFound(where + ": context " + Quoted(ctx_name) + " names user " +
                              Quoted(user_name) + ", which is not defined");
    }
    GRANARY_ASSIGN_OR_RETURN(config.client_cert_pem,
                             DataOrFile(user, "client-certificate", dir, where));
    GRANARY_ASSIGN_OR_RETURN(config.client_key_pem, DataOrFile(user, "client-key", dir, where));
    if (config.client_cert_pem.empty() != config.client_key_pem.empty()) {
      return Status::InvalidArgument(where + ": user " + Quoted(user_name) +
                                     " has a client certificate or key without the other");
    }
    config.token = Text(user, "token");
    config.token_file = Resolve(dir, Text(user, "tokenFile"));
    if (user["exec"] || user["auth-provider"]) {
      if (config.token.empty() && config.token_file.empty() && config.client_cert_pem.empty()) {
        return Status::InvalidArgument(
            where + ": user " + Quoted(user_name) +
            " uses an exec or auth-provider plugin, which granary-operator does not run; use a "
            "client certificate or a token (e.g. a ServiceAccount token)");
      }
    }
  }
  return config;
}

Result<KubeConfig> InClusterConfig(const std::string& root) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || port == nullptr || *host == '\0') {
    return Status::NotFound(
        "not in a Kubernetes pod (KUBERNETES_SERVICE_HOST is not set); pass --kubeconfig");
  }
  KubeConfig config;
  config.host = host;
  config.port = port;
  config.token_file = root + "/token";
  GRANARY_ASSIGN_OR_RETURN(config.ca_pem, ReadWholeFile(root + "/ca.crt", "service-account CA"));
  Result<std::string> ns = ReadWholeFile(root + "/namespace", "service-account namespace");
  if (ns.ok()) {
    config.namespace_ = *ns;
    while (!config.namespace_.empty() &&
           std::isspace(static_cast<unsigned char>(config.namespace_.back()))) {
      config.namespace_.pop_back();
    }
  }
  GRANARY_RETURN_IF_ERROR(ReadWholeFile(config.token_file, "service-account token").status());
  return config;
}

}  // namespace granary::kube
