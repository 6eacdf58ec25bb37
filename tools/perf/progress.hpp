// anview-perf's progress bar on stderr: which op, and which size of its sweep is being measured
// (`allreduce [=====>    ] 7/24 sizes, 1 MiB`), redrawn in place. It shows only where asked
// (rank 0, no --json) and where stderr is a terminal, and is erased before each result line
// goes to stdout and at the end, so stdout reads the same with or without it.
#pragma once

#include <cstddef>
#include <string>

namespace perf {

class Progress {
 public:
  // Draws nothing unless `wanted` and stderr is a terminal.
  explicit Progress(bool wanted);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `all`: the sweeps that follow belong to op number `index` (from 1) of `ops`.
  void set_op_index(std::size_t index, std::size_t ops);
  // A sweep of `op` over `sizes` message sizes begins.
  void start(const std::string& op, std::size_t sizes);
  // Size number `index` (from 0) of the sweep, `bytes` long, is being measured.
  void measuring(std::size_t index, std::size_t bytes);
  // Erases the bar; the next measuring() draws it again.
  void clear();

 private:
  void write(const std::string& text);

  bool enabled_;
  bool drawn_ = false;
  std::string op_;
  std::string op_index_;  // " (op 2/7)" under `all`
  std::size_t sizes_ = 0;
};

}  // namespace perf
