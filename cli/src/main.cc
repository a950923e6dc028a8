// granary: the command line (cli.h, docs/cli.md).

#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "granary/cli/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return granary::RunCli(args, std::cout, std::cerr, isatty(STDERR_FILENO) == 1);
}
