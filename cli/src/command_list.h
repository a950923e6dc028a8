// The `granary` commands, in the order `granary --help` lists them: one line
// per command file, each naming the function that adds its subcommand(s)
//   void Add<Name>Command(CLI::App& app, CliContext& context);
// (cli_context.h says how to write one). cli.cc declares and calls each.
// Deliberately without #pragma once: it is included with GRANARY_CLI_COMMAND
// defined differently each time.

GRANARY_CLI_COMMAND(AddDatasetCommand)     // dataset_command.cc
GRANARY_CLI_COMMAND(AddNodeCommand)        // cluster_command.cc
GRANARY_CLI_COMMAND(AddPlanCommand)        // cluster_command.cc
GRANARY_CLI_COMMAND(AddStatusCommand)      // cluster_command.cc
GRANARY_CLI_COMMAND(AddClusterKeyCommand)  // cluster_command.cc
GRANARY_CLI_COMMAND(AddLsCommand)          // ls_command.cc
GRANARY_CLI_COMMAND(AddCatCommand)         // cat_command.cc
GRANARY_CLI_COMMAND(AddDoctorCommand)      // doctor_command.cc
GRANARY_CLI_COMMAND(AddMountCommand)       // mount_command.cc
GRANARY_CLI_COMMAND(AddSlurmCommand)       // slurm_command.cc
