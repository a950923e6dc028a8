// granary: the command line (cli.h, docs/cli.md).

#include <unistd.h>

#include <csignal>
#include <iostream>
#include <string>
#include <vector>

#include "granary/cli/cli.h"

int main(int argc, char** argv) {
  // A reader that went away (`granary cat ... | head -c1`) is EPIPE on write,
  // which `cat` turns into a quiet exit, not a death by signal.
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  return granary::RunCli(args, std::cout, std::cerr, isatty(STDERR_FILENO) == 1, STDOUT_FILENO);
}
