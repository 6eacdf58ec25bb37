// Helpers of the tests that fork processes: a child with a pipe to the parent, lines through
// it, waiting for the child's exit.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>

namespace anview::testing {

struct Child {
  pid_t pid = -1;
  int fd = -1;  // the read end of the pipe the child writes to
};

// Forks a child that runs fn(write end of the pipe) and exits with what it returns, or with 2
// after printing what it raised (prefixed by `name`).
inline Child fork_child(const char* name, const std::function<int(int)>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) std::abort();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    int rc = 2;
    try {
      rc = fn(fds[1]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", name, e.what());
    }
    std::_Exit(rc);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

inline void write_line(int fd, const std::string& text) {
  const std::string line = text + "\n";
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::_Exit(3);
}

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
