// Anview's metrics for the whole process: per peer (messages, bytes, errors, rendezvous
// latency, flow-control state), per TCP stream (bytes, queued bytes, paused reading) and per
// collective kind and algorithm (calls, bytes, errors, stall reports, latency), labelled with
// rank and communicator. Also served over HTTP when ANVIEW_METRICS_PORT is set: each process
// on port ANVIEW_METRICS_PORT + its local rank, GET /metrics (Prometheus text) and
// GET /metrics.json.
#pragma once

#include <string>

namespace anview {

// The Prometheus text exposition format (version 0.0.4).
std::string metrics_prometheus();
// JSON: {"metrics": [{"name", "type" (counter, gauge, histogram), "help", "labels": {...},
// "value"} or, for histograms, "count", "sum" (seconds), "p50", "p99" (bucket bounds) and
// "buckets": [{"le", "count"}] (cumulative)]}.
std::string metrics_json();

}  // namespace anview
