// Detection of the launcher's environment: which rank this process is, how many there are,
// and where the bootstrap store (the "root") is served.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace anview::bootstrap {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string root;         // "host:port" of the TCP store
  std::string root_source;  // how the root was found where no variable names it (else empty)
  // With a found root: the job it was found for ("slurm job 123 step 4"). Rank 0 puts it in the
  // store; the others check it there before they write (another job may find the same root).
  std::string job;
  std::string launcher;  // "anview", "torchrun", "openmpi", "slurm"
};

// Reads variables through `getenv` (tests pass a map lookup). Tried in order:
//   anview   — ANVIEW_RANK, ANVIEW_WORLD_SIZE, ANVIEW_LOCAL_RANK (optional, default rank),
//              ANVIEW_ROOT
//   torchrun — RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR + MASTER_PORT
//   openmpi  — OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK, root from ANVIEW_ROOT or
//              MASTER_ADDR + MASTER_PORT
//   slurm    — SLURM_PROCID, SLURM_STEP_NUM_TASKS (else, and in heterogeneous jobs,
//              SLURM_NTASKS), SLURM_LOCALID, root as for openmpi; without ANVIEW_ROOT and
//              MASTER_ADDR (not in heterogeneous jobs), the first node of SLURM_STEP_NODELIST
//              (set by srun), where Slurm starts task 0, at MASTER_PORT or else at
//              20000 + (SLURM_JOB_ID % 1000) * 10 + SLURM_STEP_ID % 10
// A launcher is recognised by its rank variable. A missing or malformed piece raises a usage
// Error naming the variable. With none recognised: a usage Error listing what was looked for.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
LaunchInfo detect_launch(const EnvLookup& getenv);
LaunchInfo detect_launch();  // the process environment

// The first host of a Slurm host list ("gpu[07-09,12],cpu3" gives "gpu07"); nullopt if the
// text is not one.
std::optional<std::string> first_slurm_host(std::string_view list);

// A job of `world` ranks made to look like `hosts` machines on one (anview-run and anview-info
// --emulate-hosts, tests): consecutive ranks share one, rank r the one numbered r*hosts/world.
struct EmulatedHost {
  std::string id;      // its ANVIEW_HOST_ID: "emulated-host-<number>"
  int first_rank = 0;  // its ranks are [first_rank, first_rank + ranks)
  int ranks = 0;
};
EmulatedHost emulated_host(int rank, int world, int hosts);

// Where rank 0 serves the bootstrap store of a job whose root is `root` ("host:port").
// The root itself, except where its host is a name (not an address, not "localhost") that
// resolves to a loopback address here: /etc/hosts often maps the machine's own name there
// (Debian: 127.0.1.1), while ranks on other hosts resolve it to the host's real address and
// would find nobody listening. The store is then served on every address of that family at the
// root's port, and `why` says so (rank 0 logs it).
struct ServeAddress {
  std::string address;  // "host:port" to listen on
  std::string why;      // empty: the root as given
};
ServeAddress store_serve_address(const std::string& root, int rank);
// The decision, given what `host` resolved to (`resolved_host`, an address): tests call it.
bool serve_everywhere(const std::string& host, const std::string& resolved_host);

}  // namespace anview::bootstrap
