#include "progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include "sweep.hpp"

namespace perf {
namespace {

constexpr std::size_t bar_width = 20;
constexpr const char* erase_line = "\r\033[K";

// The terminal's width, so the bar never wraps (a wrapped line cannot be redrawn with '\r').
std::size_t terminal_columns() {
  winsize ws{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1) return ws.ws_col;
  return 80;
}

}  // namespace

Progress::Progress(bool wanted) : enabled_(wanted && ::isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() {
  clear();
}

void Progress::set_op_index(std::size_t index, std::size_t ops) {
  op_index_ = " (op " + std::to_string(index) + "/" + std::to_string(ops) + ")";
}

void Progress::start(const std::string& op, std::size_t sizes) {
  op_ = op;
  sizes_ = sizes;
}

void Progress::measuring(std::size_t index, std::size_t bytes) {
  if (!enabled_ || sizes_ == 0) return;
  const std::size_t filled = index * bar_width / sizes_;
  std::string bar(filled, '=');
  if (filled < bar_width) bar += '>';
  bar.resize(bar_width, ' ');
  std::string line = op_ + op_index_ + " [" + bar + "] " + std::to_string(index + 1) + "/" +
                     std::to_string(sizes_) + " sizes, " + human_size(bytes);
  const std::size_t columns = terminal_columns();
  if (line.size() >= columns) line.resize(columns - 1);
  write("\r" + line + "\033[K");  // the rest of a longer line before it erased
  drawn_ = true;
}

void Progress::clear() {
  if (!drawn_) return;
  write(erase_line);
  drawn_ = false;
}

void Progress::write(const std::string& text) {
  // One write, unbuffered: stdout's result lines are flushed in between.
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
}

}  // namespace perf
