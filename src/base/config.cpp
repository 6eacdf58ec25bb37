#include "base/config.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include "anview/error.hpp"

namespace anview::base {
namespace {

std::vector<const Setting*>& registry() {
  static std::vector<const Setting*> settings;
  return settings;
}

[[noreturn]] void bad_value(std::string_view what, std::string_view text, std::string_view want) {
  throw Error(ErrorKind::usage, {.operation = "config",
                                 .cause = std::string(what) + "='" + std::string(text) +
                                          "' is not " + std::string(want)});
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

}  // namespace

Setting::Setting(const char* component, const char* env, const char* default_value,
                 const char* help, Visibility visibility)
    : component_(component),
      env_(env),
      default_value_(default_value),
      help_(help),
      visibility_(visibility) {
  registry().push_back(this);
}

bool Setting::from_environment() const { return std::getenv(env_) != nullptr; }

std::string Setting::value() const {
  const char* v = std::getenv(env_);
  return v ? std::string(v) : std::string(default_value_);
}

std::string Setting::shown_value() const {
  if (!hidden()) return value();
  return value().empty() ? std::string() : std::string("(set, not shown)");
}

std::int64_t Setting::as_int() const { return parse_size(value(), env_); }

std::int64_t Setting::as_int_in(std::int64_t lo, std::int64_t hi) const {
  const std::int64_t v = as_int();
  if (v < lo || v > hi) {
    throw Error(ErrorKind::usage, {.operation = "config",
                                   .cause = std::string(env_) + "='" + value() +
                                            "' is out of range (" + std::to_string(lo) + " to " +
                                            std::to_string(hi) + ")"});
  }
  return v;
}

bool Setting::as_bool() const {
  const std::string v = lower(value());
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off" || v.empty()) return false;
  bad_value(env_, v, "a boolean (1/0, true/false, yes/no, on/off)");
}

std::chrono::milliseconds Setting::as_duration() const { return parse_duration(value(), env_); }

std::vector<std::string> Setting::as_list() const { return split_list(value()); }

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) items.push_back(item);
    start = end + 1;
  }
  return items;
}

const std::vector<const Setting*>& all_settings() { return registry(); }

std::int64_t parse_size(std::string_view text, std::string_view what) {
  std::int64_t value = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(first, last, value);
  if (ec != std::errc() || ptr == first || value < 0) bad_value(what, text, "a non-negative integer");
  std::int64_t scale = 1;
  if (ptr != last) {
    switch (std::toupper(static_cast<unsigned char>(*ptr))) {
      case 'K': scale = 1LL << 10; break;
      case 'M': scale = 1LL << 20; break;
      case 'G': scale = 1LL << 30; break;
      default: bad_value(what, text, "an integer with an optional K/M/G suffix");
    }
    ++ptr;
    if (ptr != last && (*ptr == 'i' || *ptr == 'I')) ++ptr;
    if (ptr != last && (*ptr == 'b' || *ptr == 'B')) ++ptr;
    if (ptr != last) bad_value(what, text, "an integer with an optional K/M/G suffix");
  }
  if (value > INT64_MAX / scale) bad_value(what, text, "in range");
  return value * scale;
}

std::chrono::milliseconds parse_duration(std::string_view text, std::string_view what) {
  double value = 0;
  const std::string s(text);
  char* end = nullptr;
  value = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !(value >= 0)) bad_value(what, text, "a non-negative duration");
  const std::string unit = lower(std::string_view(end));
  double ms = 0;
  if (unit.empty() || unit == "s") ms = value * 1000.0;
  else if (unit == "ms") ms = value;
  else if (unit == "us") ms = value / 1000.0;
  else if (unit == "m" || unit == "min") ms = value * 60000.0;
  else bad_value(what, text, "a duration (e.g. 30, 30s, 500ms, 2m)");
  // Deadlines are the steady clock's now plus this, in nanoseconds: ten years fit with room.
  constexpr double most_ms = 10 * 365.25 * 24 * 3600 * 1000.0;
  if (!(ms <= most_ms)) bad_value(what, text, "a duration of at most 10 years");
  return std::chrono::milliseconds(static_cast<std::int64_t>(ms + 0.5));
}

}  // namespace anview::base
