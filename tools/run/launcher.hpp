// The process management of `anview-run`: start N ranks of one program on this host, watch
// them, and stop them all when one fails, when the job runs too long or when the launcher is
// told to stop.
//
// Each rank runs in its own process group with stdin from /dev/null and this environment:
//   ANVIEW_RANK, ANVIEW_WORLD_SIZE, ANVIEW_LOCAL_RANK, ANVIEW_LOCAL_WORLD_SIZE (= world size),
//   ANVIEW_ROOT = 127.0.0.1:<a port that was free at launch>, where rank 0 serves the store;
//   with emulate_hosts K, also ANVIEW_HOST_ID = emulated-host-<h> for rank r in group
//   h = r * K / N, and the local rank and size within that group; GLIBC_TUNABLES with
//   glibc.malloc.hugetlb=1 (malloc_tunables()) unless malloc_huge_pages is off.
//
// Stopping a rank means signalling its whole process group (SIGTERM, or the signal the
// launcher received), then SIGKILL `kill_after` later if anything in the group is still alive.
// Processes the ranks leave in their groups when they exit are stopped the same way before
// the launcher exits (the exit code stays the ranks').
// Should the launcher itself be killed with SIGKILL, the ranks get SIGKILL from the kernel
// (PR_SET_PDEATHSIG); processes they started may then outlive them.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace anview::run {

struct LaunchOptions {
  int world_size = 1;
  std::vector<std::string> command;  // PROGRAM (looked up on PATH) and its arguments
  bool tag_output = false;           // prefix every output line with "[rank] "
  // Split the ranks into this many consecutive groups that act as hosts of their own
  // (ANVIEW_HOST_ID, ANVIEW_LOCAL_RANK and ANVIEW_LOCAL_WORLD_SIZE per group); 0: one host.
  int emulate_hosts = 0;
  std::optional<std::chrono::milliseconds> timeout;  // stop the whole job after this long
  std::chrono::milliseconds grace{5000};       // after a failure, before the others are stopped
  std::chrono::milliseconds kill_after{2000};  // from SIGTERM to SIGKILL
  // Ask glibc's malloc in the ranks for transparent huge pages (malloc_tunables()).
  bool malloc_huge_pages = true;
};

// The GLIBC_TUNABLES the ranks get, given the launcher's (`inherited`, null when unset): with
// `huge_pages`, glibc.malloc.hugetlb=1 added, unless the user set that tunable already. Under
// it glibc 2.35+ advises MADV_HUGEPAGE on malloc's large blocks where the kernel's policy is
// madvise (older glibc ignores the name). Large same-host messages are then copied across
// processes with 512 times fewer pages to pin: 16 MiB heap buffers stream about twice as fast.
// nullopt: leave the variable as it is.
std::optional<std::string> malloc_tunables(const char* inherited, bool huge_pages);

// The exit codes of the launcher besides the ranks' own.
inline constexpr int exit_launcher_error = 1;  // the launcher itself failed (fork, pipe, ...)
inline constexpr int exit_usage = 2;
inline constexpr int exit_timeout = 124;
inline constexpr int exit_exec_failed = 127;  // what a rank exits with when exec fails
inline constexpr int exit_signal_base = 128;  // + signal number

// Runs the job to completion and returns the launcher's exit code, decided by the first of
// these to happen (a rank's failure during the grace period keeps its code on Ctrl-C):
//   0                 every rank exited with 0;
//   the first failing rank's exit code, or 128 + signal when it was killed by a signal;
//   124               the job ran past `timeout`;
//   128 + signal      the launcher received SIGINT, SIGTERM or SIGHUP and stopped the job
//                     (a SIGHUP reaches the ranks as SIGTERM).
// Reports on stderr, one "anview-run: ..." line per event: how each failing rank ended and
// every signal the launcher sends. Its own output never blocks it (output_sink.hpp): once the
// ranks are done it waits for a slow reader to take what is queued, unless SIGINT, SIGTERM,
// SIGHUP or SIGQUIT comes first, which drops that output (exit code 128 + signal if the job
// had none). Blocks; call once per process and from its only thread
// (it blocks SIGCHLD, SIGINT, SIGTERM and SIGHUP and makes the process a child subreaper).
// Raises an internal anview::Error when a rank cannot be started; ranks started by then are
// killed first.
int run_job(const LaunchOptions& options);

}  // namespace anview::run
