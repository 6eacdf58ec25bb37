// anview-run: the local launcher.
//
//   anview-run -n N [--timeout SEC] [--tag-output] [--grace SEC] PROGRAM [ARGS...]
//
// Parses the command line and hands the job to run_job() (launcher.hpp), which documents the
// ranks' environment, the stopping rules and the exit codes. Everything from PROGRAM on is
// passed to the ranks unparsed.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "anview/error.hpp"
#include "base/config.hpp"
#include "launcher.hpp"

namespace {

using anview::run::exit_usage;

// CLI11 only knows one-letter short options, so mpirun's "-np" is rewritten to its long
// spelling "--np" among the launcher's own options, i.e. before PROGRAM.
std::vector<std::string> launcher_args(const CLI::App& app, int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string& arg = args[i];
    if (arg == "-np") arg = "--np";
    if (arg.size() < 2 || arg[0] != '-' || arg == "--") break;  // PROGRAM or the "--" mark
    const CLI::Option* option = app.get_option_no_throw(arg);
    const bool takes_next = option != nullptr && option->get_items_expected_min() > 0;
    if (takes_next) ++i;  // skip the option's value ("-n4" and "--np=4" carry their own)
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Starts N ranks of PROGRAM on this host, forwards their output and stops them all "
      "when one fails.",
      "anview-run"};
  app.prefix_command();  // PROGRAM and everything after it end up in app.remaining()
  app.footer(
      "Usage: anview-run -n N [options] PROGRAM [ARGS...]\n"
      "Each rank gets ANVIEW_RANK, ANVIEW_WORLD_SIZE, ANVIEW_LOCAL_RANK, ANVIEW_LOCAL_WORLD_SIZE\n"
      "and ANVIEW_ROOT, and the job a fresh ANVIEW_SECRET (unless ANVIEW_SECRET or\n"
      "ANVIEW_SECRET_FILE is set), and GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (see\n"
      "--no-huge-pages). Exit code: 0, the first failing rank's code (128+signal if it "
      "was\n"
      "killed), 124 on --timeout, 130/143 on SIGINT/SIGTERM, 127 if PROGRAM cannot be run.");

  anview::run::LaunchOptions options;
  std::string timeout_text = "0";
  std::string grace_text = "5";
  app.add_option("-n,--np", options.world_size, "Number of ranks (-np is accepted too)")
      ->required()
      ->type_name("N");
  app.add_option("--timeout", timeout_text,
                 "Stop the whole job (exit 124) when it runs longer than this; seconds, or with "
                 "a unit: 500ms, 2m. 0: no limit")
      ->type_name("SEC")
      ->capture_default_str();
  app.add_option("--grace", grace_text,
                 "After a rank fails, how long the others may take to end on their own before "
                 "they get SIGTERM (and SIGKILL 2 s later)")
      ->type_name("SEC")
      ->capture_default_str();
  app.add_option("--emulate-hosts", options.emulate_hosts,
                 "Split the ranks into K consecutive groups that act as separate hosts "
                 "(ANVIEW_HOST_ID per group): shared memory inside a group, the network "
                 "transports and hierarchical collectives between them")
      ->type_name("K");
  app.add_flag("--tag-output", options.tag_output,
               "Prefix each line of output with \"[rank] \" (stdout and stderr kept apart)");
  bool small_pages = false;
  app.add_flag("--no-huge-pages", small_pages,
               "Leave the ranks' malloc alone. By default they get GLIBC_TUNABLES with "
               "glibc.malloc.hugetlb=1 (unless it names that tunable already): malloc's large "
               "blocks ask for 2 MiB pages, and large same-host messages between them copy "
               "about twice as fast");

  try {
    std::vector<std::string> args = launcher_args(app, argc, argv);
    std::reverse(args.begin(), args.end());  // CLI11 takes them in reverse order
    app.parse(args);
    if (options.world_size < 1) {
      throw CLI::ValidationError("-n", "the number of ranks must be at least 1, not " +
                                           std::to_string(options.world_size));
    }
    if (options.emulate_hosts < 0 || options.emulate_hosts > options.world_size) {
      throw CLI::ValidationError("--emulate-hosts", "must be between 1 and the number of ranks (" +
                                                        std::to_string(options.world_size) +
                                                        "), not " +
                                                        std::to_string(options.emulate_hosts));
    }
    options.malloc_huge_pages = !small_pages;
    options.command = app.remaining();
    if (!options.command.empty() && options.command.front() == "--") {
      options.command.erase(options.command.begin());
    }
    if (options.command.empty()) throw CLI::RequiredError("PROGRAM");
    if (options.command.front().starts_with("-")) {
      throw CLI::ExtrasError("unknown option " + options.command.front(),
                             CLI::ExitCodes::ExtrasError);
    }
    const auto timeout = anview::base::parse_duration(timeout_text, "--timeout");
    if (timeout.count() > 0) options.timeout = timeout;
    options.grace = anview::base::parse_duration(grace_text, "--grace");
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : exit_usage;
  } catch (const anview::Error& e) {  // a bad --timeout or --grace
    std::fprintf(stderr, "anview-run: %s\nRun with --help for more information.\n", e.what());
    return exit_usage;
  }

  try {
    return anview::run::run_job(options);
  } catch (const anview::Error& e) {
    std::fprintf(stderr, "anview-run: %s\n", e.what());
    return anview::run::exit_launcher_error;
  }
}
