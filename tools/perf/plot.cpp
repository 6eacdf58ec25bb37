#include "plot.hpp"

#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "sweep.hpp"

namespace perf {
namespace {

using File = std::unique_ptr<FILE, decltype(&std::fclose)>;

File temp_file() {
  File f(std::tmpfile(), &std::fclose);
  if (!f)
    throw std::runtime_error(std::string("--plot: no temporary file: ") + std::strerror(errno));
  return f;
}

// A gnuplot single-quoted string: only the quote itself is special, written twice.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// The ops in the order they were measured.
std::vector<std::string> ops_of(const std::vector<PlotPoint>& points) {
  std::vector<std::string> ops;
  for (const auto& p : points)
    if (ops.empty() || ops.back() != p.op) ops.push_back(p.op);
  return ops;
}

bool has_bandwidth(const std::vector<PlotPoint>& points, const std::string& op) {
  for (const auto& p : points)
    if (p.op == op && !std::isnan(p.bandwidth_gbs)) return true;
  return false;
}

// Tics at powers of two across the sizes, at most about a dozen, labelled like "1 MiB", and the
// x range.
std::string xtics(const std::vector<PlotPoint>& points) {
  std::size_t lo = points.front().bytes, hi = lo;
  for (const auto& p : points) {
    lo = std::min(lo, p.bytes);
    hi = std::max(hi, p.bytes);
  }
  const int first = static_cast<int>(std::floor(std::log2(static_cast<double>(lo))));
  const int last = static_cast<int>(std::ceil(std::log2(static_cast<double>(hi))));
  const int step = std::max(1, (last - first + 11) / 12);
  std::string tics;
  for (int e = first; e <= last; e += step) {
    const std::size_t bytes = std::size_t{1} << e;
    tics += (tics.empty() ? "" : ", ") + quoted(human_size(bytes)) + " " + std::to_string(bytes);
  }
  // A little room on both sides, so the first and last tics are drawn.
  return "set xtics (" + tics + ")\nset xrange [" + std::to_string(std::ldexp(0.8, first)) + ":" +
         std::to_string(std::ldexp(1.25, last)) + "]\n";
}

// One data block per op ($op0, $op1, ...: bytes, bandwidth, latency), then the two plots.
std::string script(const std::vector<PlotPoint>& points, const PlotLabels& labels,
                   const std::string& path) {
  const auto ops = ops_of(points);
  std::ostringstream s;
  s.precision(9);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    s << "$op" << i << " << EOD\n";
    for (const auto& p : points) {
      if (p.op != ops[i]) continue;
      s << p.bytes << ' ';
      if (std::isnan(p.bandwidth_gbs))
        s << "NaN";
      else
        s << p.bandwidth_gbs;
      s << ' ' << p.latency_us << '\n';
    }
    s << "EOD\n";
  }
  auto lines = [&](int column, bool bandwidth_only) {
    std::string plot;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (bandwidth_only && !has_bandwidth(points, ops[i])) continue;
      plot += (plot.empty() ? "plot " : ", ") + std::string("$op") + std::to_string(i) +
              " using 1:" + std::to_string(column) + " with linespoints title " + quoted(ops[i]);
    }
    return plot + "\n";
  };
  bool any_bandwidth = false;
  for (const auto& op : ops) any_bandwidth = any_bandwidth || has_bandwidth(points, op);
  s << "set encoding utf8\n"
    << "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
       "  set terminal pngcairo noenhanced size 1000,900\n"
       "} else {\n"
       "  set terminal png noenhanced size 1000,900\n"
       "}\n"
    << "set output " << quoted(path) << "\n"
    << "set multiplot layout " << (any_bandwidth ? 2 : 1) << ",1 title " << quoted(labels.title)
    << "\n"
    << "set logscale x 2\n"
    << xtics(points) << "set grid\nset key left top\nset lmargin 12\n"
    << "set xlabel 'message size'\n";
  if (any_bandwidth) {
    s << "set ylabel " << quoted(labels.bandwidth) << "\nset yrange [0:*]\n"
      << lines(2, true) << "set autoscale y\n";
  }
  s << "set ylabel " << quoted(labels.latency) << "\nset logscale y 10\n"
    << lines(3, false) << "unset multiplot\n";
  return s.str();
}

// Runs gnuplot with `in` on stdin and its stdout and stderr in `messages`; returns its wait
// status.
int run_gnuplot(FILE* in, FILE* messages) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fileno(in), STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fileno(messages), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fileno(messages), STDERR_FILENO);
  char name[] = "gnuplot";
  char* argv[] = {name, nullptr};
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, name, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc == ENOENT)
    throw std::runtime_error(
        "--plot needs gnuplot (apt-get install gnuplot-nox): not found on PATH");
  if (rc != 0)
    throw std::runtime_error(std::string("--plot: cannot run gnuplot: ") + std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      throw std::runtime_error(std::string("--plot: waitpid: ") + std::strerror(errno));
  return status;
}

std::string contents(FILE* f) {
  std::rewind(f);
  std::string text;
  char buffer[4096];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) text.append(buffer, n);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? "it said nothing" : text;
}

}  // namespace

void check_plot_path(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file(path);
  std::error_code ec;
  if (path.empty() || !file.has_filename() || fs::is_directory(file, ec))
    throw std::runtime_error("--plot " + path + ": names no file to write");
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  if (!fs::is_directory(folder, ec))
    throw std::runtime_error("--plot " + path + ": the folder " + folder.string() +
                             " does not exist");
  if (::access(folder.c_str(), W_OK) != 0)
    throw std::runtime_error("--plot " + path + ": cannot write in " + folder.string() + ": " +
                             std::strerror(errno));
}

void plot(const std::vector<PlotPoint>& points, const PlotLabels& labels, const std::string& path) {
  std::vector<PlotPoint> drawn;  // 0 bytes has no place on a log axis
  for (const auto& p : points)
    if (p.bytes > 0) drawn.push_back(p);
  if (drawn.empty()) throw std::runtime_error("--plot: no message size above 0 bytes to draw");
  File in = temp_file(), messages = temp_file();
  const std::string text = script(drawn, labels, path);
  if (std::fwrite(text.data(), 1, text.size(), in.get()) != text.size() || std::fflush(in.get()))
    throw std::runtime_error("--plot: cannot write the gnuplot script to a temporary file");
  std::rewind(in.get());
  const int status = run_gnuplot(in.get(), messages.get());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string how = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                              : "signal " + std::to_string(WTERMSIG(status));
    throw std::runtime_error("--plot: gnuplot failed (" + how + ") drawing " + path + ": " +
                             contents(messages.get()));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || st.st_size == 0)
    throw std::runtime_error("--plot: gnuplot wrote nothing to " + path + ": " +
                             contents(messages.get()));
}

}  // namespace perf
