// --plot: after the sweep, rank 0 draws what it measured into a PNG with gnuplot: bandwidth on
// top, latency below, both against the message size (log2 axis), one line per op.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace perf {

// One result line, as --plot draws it.
struct PlotPoint {
  std::string op;
  std::size_t bytes = 0;
  double bandwidth_gbs = 0;  // busbw for collectives, GB/s for pingpong and bw; NaN: none
  double latency_us = 0;     // p50 for pingpong and bw, time_us for collectives
};

struct PlotLabels {
  std::string title;
  std::string bandwidth;  // the y axis of the upper plot
  std::string latency;    // the y axis of the lower plot
};

// Throws std::runtime_error unless a file can be written at `path` (its folder exists and is
// writable, and it is no folder itself), so a bad --plot fails before the sweep.
void check_plot_path(const std::string& path);

// Runs gnuplot on `points`, writing the PNG `path`; throws std::runtime_error naming the cause
// when gnuplot is not on PATH, fails, or writes nothing.
void plot(const std::vector<PlotPoint>& points, const PlotLabels& labels, const std::string& path);

}  // namespace perf
