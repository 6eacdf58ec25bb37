#include "base/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace anview::base::metrics {
namespace {

struct Registry {
  std::mutex collect_mu;  // held while collecting: a Group's destructor waits for it
  std::mutex mu;          // groups
  std::map<std::uint64_t, Group::Collect> groups;
  std::uint64_t next_id = 1;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: groups may outlive static destruction
  return *r;
}

// A label value in the exposition format: backslash, quote and newline escaped.
std::string escaped(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string label_text(const Labels& labels, const char* extra_name = nullptr,
                       const std::string& extra_value = {}) {
  if (labels.empty() && extra_name == nullptr) return {};
  std::string out = "{";
  for (const auto& [k, v] : labels) {
    if (out.size() > 1) out += ',';
    out += k + "=\"" + escaped(v) + "\"";
  }
  if (extra_name != nullptr) {
    if (out.size() > 1) out += ',';
    out += std::string(extra_name) + "=\"" + extra_value + "\"";
  }
  return out + "}";
}

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Groups samples by family, so each family's HELP and TYPE come once, its samples together.
class TextSink final : public Sink {
 public:
  void counter(const char* name, const char* help, const Labels& labels, double value) override {
    family(name, help, "counter") += name + label_text(labels) + " " + number(value) + "\n";
  }
  void gauge(const char* name, const char* help, const Labels& labels, double value) override {
    family(name, help, "gauge") += name + label_text(labels) + " " + number(value) + "\n";
  }
  void histogram(const char* name, const char* help, const Labels& labels,
                 const Histogram& h) override {
    std::string& out = family(name, help, "histogram");
    std::uint64_t cumulative = 0;
    for (int i = 0; i <= Histogram::buckets; ++i) {
      cumulative += h.bucket(i);
      const std::string le = i == Histogram::buckets ? "+Inf" : number(Histogram::upper_bound(i));
      out += std::string(name) + "_bucket" + label_text(labels, "le", le) + " " +
             std::to_string(cumulative) + "\n";
    }
    out += std::string(name) + "_sum" + label_text(labels) + " " + number(h.sum()) + "\n";
    out +=
        std::string(name) + "_count" + label_text(labels) + " " + std::to_string(h.count()) + "\n";
  }
  std::string text() const {
    std::string out;
    for (const auto& [name, body] : families_) out += body;
    return out;
  }

 private:
  std::string& family(const char* name, const char* help, const char* type) {
    auto [it, fresh] = families_.try_emplace(name);
    if (fresh) {
      it->second =
          std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    }
    return it->second;
  }
  std::map<std::string, std::string> families_;
};

}  // namespace

double Histogram::upper_bound(int i) {
  return std::ldexp(1e-6, i);
}

void Histogram::observe(Clock::duration d) {
  // The first bucket whose bound (1000 ns * 2^i) is not below d, without a division (this runs
  // once per collective call): the bucket for bounds of 1024 ns * 2^i, one up if d passes
  // 1000 ns * 2^i.
  const auto ns = static_cast<std::uint64_t>(
      std::max<std::int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(), 1));
  const std::uint64_t q = (ns - 1) >> 10;
  int i = q == 0 ? 0 : 64 - __builtin_clzll(q);
  if (i < buckets && ns > (std::uint64_t{1000} << i)) ++i;
  i = std::min(i, buckets);
  bump(counts_[static_cast<std::size_t>(i)]);
  bump(count_);
  bump(sum_ns_, ns);
}

double Histogram::quantile(double q) const {
  const std::uint64_t n = count();
  if (n == 0) return 0;
  const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(n)));
  std::uint64_t seen = 0;
  for (int i = 0; i < buckets; ++i) {
    seen += bucket(i);
    if (seen >= rank) return upper_bound(i);
  }
  return upper_bound(buckets - 1) * 2;  // past the last bound: said as twice it
}

Group::Group(Collect collect) {
  if constexpr (!enabled) return;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  id_ = r.next_id++;
  r.groups.emplace(id_, std::move(collect));
}

Group& Group::operator=(Group&& other) noexcept {
  if (this != &other) {
    Group gone(std::move(*this));
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

Group::~Group() {
  if (id_ == 0) return;
  Registry& r = registry();
  std::lock_guard collecting(r.collect_mu);
  std::lock_guard lock(r.mu);
  r.groups.erase(id_);
}

void collect_all(Sink& sink) {
  Registry& r = registry();
  std::lock_guard collecting(r.collect_mu);
  std::vector<const Group::Collect*> groups;
  {
    std::lock_guard lock(r.mu);
    for (const auto& [id, collect] : r.groups) groups.push_back(&collect);
  }
  for (const auto* collect : groups) (*collect)(sink);  // stay: removal waits for collect_mu
}

std::string prometheus_text() {
  TextSink sink;
  collect_all(sink);
  return sink.text();
}

}  // namespace anview::base::metrics
