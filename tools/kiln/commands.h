// The kiln subcommands. Each takes the arguments after its name and returns the exit status
// (flags.h: 0 ok, 1 failure, 2 bad command line).
#pragma once

#include <string>
#include <vector>

#include "flags.h"

namespace kiln::cli {

using Argv = std::vector<std::string>;

int build_command(const Argv& argv);
int run_command(const Argv& argv);
int bench_command(const Argv& argv);
int inspect_command(const Argv& argv);
int compare_command(const Argv& argv);

// Prints "kiln SUB: error: ..." to stderr and returns its exit code.
int report(const std::string& command, const Error& error);

}  // namespace kiln::cli
