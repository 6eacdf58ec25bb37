// Settings: each component declares its settings in one table of `Setting` objects at namespace
// scope in its own .cpp file (UCX config-table style). Every declared setting registers itself,
// so `anview-info --config` can print all of them with their value and where it came from.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace anview::base {

class Setting {
 public:
  // hidden: a secret; tools show only whether it is set, never its value.
  enum class Visibility { shown, hidden };
  // Registers the setting; objects must have static storage duration.
  Setting(const char* component, const char* env, const char* default_value, const char* help,
          Visibility visibility = Visibility::shown);
  Setting(const Setting&) = delete;
  Setting& operator=(const Setting&) = delete;

  const char* component() const { return component_; }
  const char* env() const { return env_; }
  const char* default_value() const { return default_value_; }
  const char* help() const { return help_; }

  bool from_environment() const;  // true when the variable is set
  std::string value() const;      // the environment's value, else the default
  bool hidden() const { return visibility_ == Visibility::hidden; }
  // What tools print: value(), or for a hidden setting "(set, not shown)" / "".
  std::string shown_value() const;

  // Typed reads. A value that does not parse raises a usage Error naming the variable.
  std::int64_t as_int() const;                    // accepts K/M/G suffixes (powers of 1024)
  bool as_bool() const;                           // 1/0, true/false, yes/no, on/off
  std::chrono::milliseconds as_duration() const;  // seconds unless suffixed ms/us/s/m
  std::vector<std::string> as_list() const;       // comma separated, empty items dropped
  // as_int(), and a usage Error naming the variable when it is outside [lo, hi].
  std::int64_t as_int_in(std::int64_t lo, std::int64_t hi) const;

 private:
  const char* component_;
  const char* env_;
  const char* default_value_;
  const char* help_;
  Visibility visibility_;
};

// All settings registered so far, in registration order.
const std::vector<const Setting*>& all_settings();

// Parsers shared with the tools (sizes like "64K", durations like "500ms").
// "a, b,,c" -> {"a", "b", "c"}: comma separated, items trimmed, empty ones dropped.
std::vector<std::string> split_list(const std::string& text);
std::int64_t parse_size(std::string_view text, std::string_view what);
std::chrono::milliseconds parse_duration(std::string_view text, std::string_view what);

}  // namespace anview::base
