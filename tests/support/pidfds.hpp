// Whether this process may open pidfds of its own pid and take descriptors through them
// (pidfd_open, pidfd_getfd: Linux 5.6, and no seccomp filter refusing them). Tests of what
// needs them skip where they are refused.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

namespace anview::testing {

inline bool pidfds_work() {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
  if (pidfd < 0) return false;
  const int copy = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, STDERR_FILENO, 0));
  ::close(pidfd);
  if (copy < 0) return false;
  ::close(copy);
  return true;
}

}  // namespace anview::testing
