// What Anview parses from its environment: sizes and durations of settings
// (base/config.hpp), and the launcher variables of anview-run, torchrun, Open MPI and Slurm
// (bootstrap/launch_env.hpp). Bad text must be a usage Error naming the variable, never
// another exception, a crash or a nonsense value. Input: a selector byte, then the text; for
// the launcher, lines of NAME=value.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "anview/error.hpp"
#include "base/config.hpp"
#include "base/socket.hpp"
#include "bootstrap/launch_env.hpp"
#include "check.hpp"

namespace {

void size_text(const std::string& text) {
  std::int64_t value = 0;
  try {
    value = anview::base::parse_size(text, "ANVIEW_FUZZ");
  } catch (const anview::Error& e) {
    FUZZ_CHECK(e.kind() == anview::ErrorKind::usage);
    return;
  }
  FUZZ_CHECK(value >= 0);
  FUZZ_CHECK(anview::base::parse_size(std::to_string(value), "ANVIEW_FUZZ") == value);
}

void duration_text(const std::string& text) {
  std::chrono::milliseconds value{};
  try {
    value = anview::base::parse_duration(text, "ANVIEW_FUZZ");
  } catch (const anview::Error& e) {
    FUZZ_CHECK(e.kind() == anview::ErrorKind::usage);
    return;
  }
  FUZZ_CHECK(value.count() >= 0);
  const std::string again = std::to_string(value.count()) + "ms";
  FUZZ_CHECK(anview::base::parse_duration(again, "ANVIEW_FUZZ") == value);
}

void launcher_environment(const std::string& text) {
  std::map<std::string, std::string> env;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);
    if (const auto eq = line.find('='); eq != std::string::npos)
      env[line.substr(0, eq)] = line.substr(eq + 1);
    at = end + 1;
  }
  anview::bootstrap::LaunchInfo info;
  try {
    info = anview::bootstrap::detect_launch([&](const std::string& name) {
      const auto it = env.find(name);
      return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
    });
  } catch (const anview::Error& e) {
    FUZZ_CHECK(e.kind() == anview::ErrorKind::usage);
    return;
  }
  FUZZ_CHECK(info.world_size >= 1);
  FUZZ_CHECK(info.rank >= 0 && info.rank < info.world_size);
  FUZZ_CHECK(info.local_rank >= 0 && info.local_rank < info.world_size);
  std::string host;
  std::uint16_t port = 0;
  FUZZ_CHECK(anview::base::split_host_port(info.root, &host, &port) && port != 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0:
      size_text(text);
      break;
    case 1:
      duration_text(text);
      break;
    default:
      launcher_environment(text);
  }
  return 0;
}
