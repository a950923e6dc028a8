// RunCli: the parser, the global options, and dispatch to the commands of
// command_list.h (each in its own file; cli_context.h says how to add one).

#include "granary/cli/cli.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli_context.h"
#include "granary/core/names.h"

namespace granary {
namespace cli {

#define GRANARY_CLI_COMMAND(add) void add(CLI::App& app, CliContext& context);
#include "command_list.h"
#undef GRANARY_CLI_COMMAND

namespace {

int Run(const std::vector<std::string>& args, CliContext& context) {
  CLI::App app{"granary: datasets staged next to the GPUs.", "granary"};
  app.set_version_flag("--version", std::string("granary ") + GRANARY_VERSION);
  app.footer(ExitCodesHelp());
  app.require_subcommand(1);
  // Global options may also follow the subcommand (`granary dataset list -o json`).
  app.fallthrough();
  app.add_option("--store", context.store_option(),
                 "Metadata store URL (redis://host:port or sqlite:///path); default "
                 "$GRANARY_STORE, else " +
                     DefaultStoreUrl());
  app.add_option("--cluster-key-file", context.cluster_key_option(),
                 "Cluster key proved to cache nodes that require authentication; default "
                 "$GRANARY_CLUSTER_KEY_FILE, else /etc/granary/cluster.key if readable");
  app.add_option("--tls-ca-file", context.tls_ca_option(),
                 "CA that cache nodes serving TLS must chain to; default $GRANARY_TLS_CA_FILE, "
                 "else they are read encrypted but unverified");
  app.add_option("--transport", context.transport_option(),
                 "How cache nodes are read: tcp (default) or libfabric (nodes that offer a "
                 "fabric address; docs/transport.md)")
      ->check(CLI::IsMember({"tcp", "libfabric"}));
  app.add_option("--libfabric-provider", context.libfabric_provider_option(),
                 "The libfabric provider with --transport libfabric: tcp (default) or verbs");
  app.add_option("-o,--output", context.output_option(), "Output format: human or json")
      ->check(CLI::IsMember({"human", "json"}));

#define GRANARY_CLI_COMMAND(add) add(app, context);
#include "command_list.h"
#undef GRANARY_CLI_COMMAND

  // An unknown command gets named (CLI11 would only say one is required).
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    names.push_back(sub->get_name());
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--store" || a == "-o" || a == "--output" || a == "--cluster-key-file" ||
        a == "--tls-ca-file" || a == "--transport" || a == "--libfabric-provider") {
      ++i;
      continue;
    }
    if (a.rfind("-", 0) == 0) continue;
    if (std::find(names.begin(), names.end(), a) == names.end()) {
      std::string list;
      for (size_t n = 0; n < names.size(); ++n) {
        list += (n == 0 ? "" : n + 1 == names.size() ? " and " : ", ") + names[n];
      }
      context.err() << "granary: unknown command " << Quoted(a) << "; the commands are " << list
                    << " (granary --help)\n";
      return kCliUsage;
    }
    break;
  }
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e, context.out(), context.err());
    return code == 0 ? kCliOk : kCliUsage;
  }
  const std::function<Status()> handler = context.ParsedHandler();
  if (!handler) {
    context.err() << "granary: no command given (granary --help)\n";
    return kCliUsage;
  }
  const Status status = handler();
  if (status.ok()) return kCliOk;
  context.err() << "granary: error: " << status.message() << "\n";
  return ExitCodeOf(status);
}

}  // namespace
}  // namespace cli

std::string DefaultStoreUrl() {
  if (geteuid() == 0) return "sqlite:///var/lib/granary/granary.db";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') {
    return std::string("sqlite://") + home + "/.local/state/granary/granary.db";
  }
  return "sqlite:///tmp/granary-" + std::to_string(geteuid()) + "/granary.db";
}

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           bool interactive, int stdout_fd) {
  cli::CliContext context(out, err, interactive, stdout_fd);
  return cli::Run(args, context);
}

}  // namespace granary
