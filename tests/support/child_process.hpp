// Helpers of the tests that fork processes: reading a line a child wrote to a pipe, waiting
// for a child's exit.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace anview::testing {

inline std::string read_line(int fd) {
  std::string line;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

// The exit code, or 128 + the signal that ended it.
inline int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace anview::testing
