// The public metrics functions (include/anview/metrics.hpp) over base/metrics.
#include "anview/metrics.hpp"

#include <nlohmann/json.hpp>

#include "base/metrics.hpp"

namespace anview {
namespace {

using Json = nlohmann::ordered_json;

class JsonSink final : public base::metrics::Sink {
 public:
  void counter(const char* name, const char* help, const base::metrics::Labels& labels,
               double value) override {
    Json j = sample(name, "counter", help, labels);
    j["value"] = value;
    out_.push_back(std::move(j));
  }
  void gauge(const char* name, const char* help, const base::metrics::Labels& labels,
             double value) override {
    Json j = sample(name, "gauge", help, labels);
    j["value"] = value;
    out_.push_back(std::move(j));
  }
  void histogram(const char* name, const char* help, const base::metrics::Labels& labels,
                 const base::metrics::Histogram& h) override {
    Json j = sample(name, "histogram", help, labels);
    j["count"] = h.count();
    j["sum"] = h.sum();
    j["p50"] = h.quantile(0.5);
    j["p99"] = h.quantile(0.99);
    Json buckets = Json::array();
    std::uint64_t cumulative = 0;
    for (int i = 0; i < base::metrics::Histogram::buckets; ++i) {
      cumulative += h.bucket(i);
      buckets.push_back({{"le", base::metrics::Histogram::upper_bound(i)}, {"count", cumulative}});
    }
    j["buckets"] = std::move(buckets);
    out_.push_back(std::move(j));
  }
  Json take() { return Json{{"metrics", std::move(out_)}}; }

 private:
  static Json sample(const char* name, const char* type, const char* help,
                     const base::metrics::Labels& labels) {
    Json l = Json::object();
    for (const auto& [k, v] : labels) l[k] = v;
    return Json{{"name", name}, {"type", type}, {"help", help}, {"labels", std::move(l)}};
  }
  Json out_ = Json::array();
};

}  // namespace

std::string metrics_prometheus() {
  return base::metrics::prometheus_text();
}

std::string metrics_json() {
  JsonSink sink;
  base::metrics::collect_all(sink);
  return sink.take().dump();
}

}  // namespace anview
