// anview-info: what this build of Anview is and what it would do on this machine.
//
//   anview-info [--json]           version, build features, the transports usable here (and why
//                                  one is not), every setting with its value and where it came
//                                  from (default or environment)
//   anview-info --config [--json]  only the settings
//   anview-run -n 4 anview-info --peers [--emulate-hosts K] [--json]
//                                  every rank connects; rank 0 prints the per-peer transport
//                                  plan: which transport serves each pair, why, and the link
//   anview-run -n 4 anview-info --explain allreduce 64M
//                                  every rank connects; rank 0 prints every algorithm the tuner
//                                  considers for that collective and size, its predicted time
//                                  (or why it cannot run), the pick, and the measured costs
//
//   anview-info --dump [PID...]    the flight recorders of running Anview processes on this host
//                                  (all of them, or those PIDs), as one JSON array: each
//                                  communicator's latest collectives, pending requests, peers
//
// Nothing here creates a communicator except --peers and --explain.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "anview/anview.hpp"
#include "base/config.hpp"
#include "base/tls.hpp"
#include "bootstrap/interfaces.hpp"
#include "bootstrap/launch_env.hpp"
#include "collectives/reduce.hpp"
#include "core/dump_service.hpp"
#include "transport/registry.hpp"

extern char** environ;

namespace {

using json = nlohmann::ordered_json;  // keys in the order written

#ifndef ANVIEW_VERSION
#define ANVIEW_VERSION "unknown"
#endif
#ifndef ANVIEW_BUILD_TYPE
#define ANVIEW_BUILD_TYPE "unknown"
#endif
#ifndef ANVIEW_BUILD_SANITIZE
#define ANVIEW_BUILD_SANITIZE ""
#endif

struct Options {
  bool config = false;
  bool peers = false;
  bool json = false;
  int emulate_hosts = 0;               // 0: off
  std::vector<std::string> explain;    // collective, size
  std::vector<std::string> dump_pids;  // --dump
};

constexpr anview::Tag size_tag{1};
constexpr anview::Tag data_tag{2};
constexpr anview::Tag done_tag{3};

// Variables the launchers set; they are not settings.
const std::vector<std::string_view> launcher_variables = {"ANVIEW_RANK", "ANVIEW_WORLD_SIZE",
                                                          "ANVIEW_LOCAL_RANK",
                                                          "ANVIEW_LOCAL_WORLD_SIZE", "ANVIEW_ROOT"};

const anview::base::Setting* find_setting(std::string_view env) {
  for (const auto* s : anview::base::all_settings())
    if (env == s->env()) return s;
  return nullptr;
}

std::string setting_value(std::string_view env) {
  const auto* s = find_setting(env);
  return s ? s->shown_value() : std::string();
}

std::string join(const std::vector<std::string>& items, std::string_view sep = ", ") {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : std::string(sep)) + item;
  return out;
}

// Prints `text` word-wrapped to 100 columns, every line indented by `indent` spaces.
void print_wrapped(const std::string& text, std::size_t indent) {
  const std::size_t width = 100;
  std::string line;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      std::printf("%*s%s\n", static_cast<int>(indent), "", line.c_str());
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    start = end + 1;
  }
  if (!line.empty()) std::printf("%*s%s\n", static_cast<int>(indent), "", line.c_str());
}

// ---- build features ----

json build_features() {
#if defined(__clang__)
  const std::string compiler = __VERSION__;  // "Debian Clang 14.0.6"
#elif defined(__GNUC__)
  const std::string compiler = std::string("GCC ") + __VERSION__;
#else
  const std::string compiler = __VERSION__;
#endif
  std::string standard = "C++20";
  if (__cplusplus > 202002L) standard = "C++23 or later";
  std::vector<std::string> sanitizers;
#if defined(__SANITIZE_ADDRESS__)
  sanitizers.push_back("address");
#endif
#if defined(__SANITIZE_THREAD__)
  sanitizers.push_back("thread");
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(__SANITIZE_ADDRESS__)
  sanitizers.push_back("address");
#endif
#if __has_feature(thread_sanitizer) && !defined(__SANITIZE_THREAD__)
  sanitizers.push_back("thread");
#endif
#endif
  // UBSan has no predefined macro: ANVIEW_SANITIZE=address builds with ASan and UBSan.
  if (std::string_view(ANVIEW_BUILD_SANITIZE) == "address") sanitizers.push_back("undefined");
#if defined(NDEBUG)
  const bool assertions = false;
#else
  const bool assertions = true;
#endif
  auto transports = anview::transport::known_transports();
  transports.push_back("self");
  std::vector<std::string> kernels;  // reduction kernel sets this CPU runs, widest first
  for (const char* isa : {"avx512", "avx2", "generic"})
    if (anview::collectives::reduce_kernels(isa) != nullptr) kernels.push_back(isa);
  return json{{"compiler", compiler},
              {"build_type", ANVIEW_BUILD_TYPE},
              {"cxx_standard", standard + " (" + std::to_string(__cplusplus) + ")"},
              {"sanitizers", sanitizers},
              {"assertions", assertions},
              {"transports", transports},
              {"reduce_kernels", std::string(anview::collectives::reduce_kernels_name())},
              {"reduce_kernels_available", kernels},
              {"tls", anview::base::tls::describe_configuration()}};
}

// ---- transports usable here ----

json transports_here() {
  json out = json::array();
  for (const auto& p : anview::transport::probe_transports()) {
    out.push_back(json{{"name", p.name},
                       {"selected", p.selected},
                       {"usable", p.usable},
                       {"detail", p.detail},
                       {"notes", p.notes}});
  }
  return out;
}

// Names in ANVIEW_TRANSPORTS this build does not have (creating a communicator would fail).
std::vector<std::string> unknown_selected_transports() {
  const auto known = anview::transport::known_transports();
  std::vector<std::string> unknown;
  const auto* s = find_setting("ANVIEW_TRANSPORTS");
  if (s == nullptr) return unknown;
  for (const auto& name : s->as_list())
    if (std::find(known.begin(), known.end(), name) == known.end()) unknown.push_back(name);
  return unknown;
}

// ---- settings ----

// Components in layer order, bottom up; others after them.
int component_order(std::string_view component) {
  static const std::vector<std::string_view> order = {"base", "auth", "bootstrap", "transport",
                                                      "shm",  "tcp",  "p2p"};
  const auto it = std::find(order.begin(), order.end(), component);
  return static_cast<int>(it - order.begin());
}

json settings() {
  std::vector<const anview::base::Setting*> all = anview::base::all_settings();
  std::stable_sort(all.begin(), all.end(), [](const auto* a, const auto* b) {
    const int ca = component_order(a->component());
    const int cb = component_order(b->component());
    if (ca != cb) return ca < cb;
    if (std::string_view(a->component()) != b->component())
      return std::string_view(a->component()) < b->component();
    return std::string_view(a->env()) < b->env();
  });
  json out = json::array();
  for (const auto* s : all) {
    out.push_back(json{{"name", s->env()},
                       {"value", s->shown_value()},
                       {"source", s->from_environment() ? "environment" : "default"},
                       {"default", s->default_value()},
                       {"component", s->component()},
                       {"help", s->help()}});
  }
  return out;
}

// ANVIEW_* variables in the environment that are neither a setting nor a launcher's: most
// likely misspelt settings, which would otherwise be ignored in silence.
std::vector<std::string> unknown_environment() {
  std::vector<std::string> unknown;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.rfind("ANVIEW_", 0) != 0) continue;
    const std::string_view name = entry.substr(0, entry.find('='));
    if (find_setting(name) != nullptr) continue;
    if (std::find(launcher_variables.begin(), launcher_variables.end(), name) !=
        launcher_variables.end())
      continue;
    unknown.emplace_back(name);
  }
  std::sort(unknown.begin(), unknown.end());
  return unknown;
}

void print_settings(const json& all, const std::vector<std::string>& unknown) {
  std::printf("settings (%zu; environment variables, value and where it came from):\n", all.size());
  std::string component;
  for (const auto& s : all) {
    if (s["component"] != component) {
      component = s["component"].get<std::string>();
      std::printf("  [%s]\n", component.c_str());
    }
    std::string line = s["name"].get<std::string>() + "=" + s["value"].get<std::string>();
    std::printf("    %-44s %s", line.c_str(), s["source"].get<std::string>().c_str());
    if (s["source"] == "environment")
      std::printf(" (default %s)", s["default"].get<std::string>().c_str());
    std::printf("\n");
    print_wrapped(s["help"].get<std::string>(), 8);
  }
  for (const auto& name : unknown)
    std::printf("  warning: %s is set but is no setting of this build (misspelt?)\n", name.c_str());
}

int print_info(const Options& o) {
  const json all_settings = settings();
  const auto unknown_env = unknown_environment();
  if (o.config) {
    if (o.json) {
      std::printf(
          "%s\n",
          json{{"settings", all_settings}, {"unknown_environment", unknown_env}}.dump(2).c_str());
    } else {
      print_settings(all_settings, unknown_env);
    }
    return 0;
  }
  const json build = build_features();
  const json transports = transports_here();
  const auto unknown_transports = unknown_selected_transports();
  if (o.json) {
    json out{{"version", ANVIEW_VERSION},
             {"build", build},
             {"transports_setting", setting_value("ANVIEW_TRANSPORTS")},
             {"unknown_transports", unknown_transports},
             {"transports", transports},
             {"settings", all_settings},
             {"unknown_environment", unknown_env}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("anview %s\n\n", ANVIEW_VERSION);
  std::printf("build:\n");
  std::printf("  compiler        %s\n", build["compiler"].get<std::string>().c_str());
  std::printf("  build type      %s%s\n", build["build_type"].get<std::string>().c_str(),
              build["assertions"].get<bool>() ? " (assertions on)" : "");
  std::printf("  C++ standard    %s\n", build["cxx_standard"].get<std::string>().c_str());
  const auto sanitizers = build["sanitizers"].get<std::vector<std::string>>();
  std::printf("  sanitizers      %s\n", sanitizers.empty() ? "none" : join(sanitizers).c_str());
  std::printf("  transports      %s\n",
              join(build["transports"].get<std::vector<std::string>>()).c_str());
  std::printf("  tls             %s\n", build["tls"].get<std::string>().c_str());
  std::printf("  reduce kernels  %s (this CPU runs: %s; ANVIEW_CPU_KERNELS=%s)\n\n",
              build["reduce_kernels"].get<std::string>().c_str(),
              join(build["reduce_kernels_available"].get<std::vector<std::string>>()).c_str(),
              setting_value("ANVIEW_CPU_KERNELS").c_str());

  const auto* selection = find_setting("ANVIEW_TRANSPORTS");
  std::printf("transports on this machine (ANVIEW_TRANSPORTS=%s, %s):\n",
              setting_value("ANVIEW_TRANSPORTS").c_str(),
              selection && selection->from_environment() ? "environment" : "default");
  for (const auto& t : transports) {
    std::string state = t["usable"].get<bool>() ? "usable" : "NOT USABLE";
    state += t["selected"].get<bool>() ? ", selected" : ", not selected";
    std::printf("  %-4s %s\n", t["name"].get<std::string>().c_str(), state.c_str());
    print_wrapped(t["detail"].get<std::string>(), 7);
    for (const auto& note : t["notes"]) print_wrapped("- " + note.get<std::string>(), 7);
  }
  for (const auto& name : unknown_transports) {
    std::printf("  warning: ANVIEW_TRANSPORTS names '%s', which this build does not have\n",
                name.c_str());
  }
  std::printf("\n");
  print_settings(all_settings, unknown_env);
  return unknown_transports.empty() ? 0 : 1;
}

// ---- --peers ----

// Sets ANVIEW_HOST_ID so that the job looks spread over `hosts` machines: consecutive ranks
// share one (rank * hosts / size). For demos and tests of the cross-host paths on one machine.
void emulate_hosts(int hosts) {
  const auto launch = anview::bootstrap::detect_launch();
  if (hosts > launch.world_size) {
    throw anview::Error(anview::ErrorKind::usage,
                        {.rank = launch.rank,
                         .operation = "anview-info --emulate-hosts",
                         .cause = "--emulate-hosts " + std::to_string(hosts) + " exceeds the " +
                                  std::to_string(launch.world_size) + " ranks of the job"});
  }
  ::setenv("ANVIEW_HOST_ID",
           anview::bootstrap::emulated_host(launch.rank, launch.world_size, hosts).id.c_str(), 1);
}

// This rank's view: its host and, for every other rank, the transport, why, and the link.
json own_plan(const anview::Communicator& comm) {
  json peers = json::array();
  for (int p = 0; p < comm.size(); ++p) {
    if (p == comm.rank()) continue;
    const std::string name = comm.transport_name(p);
    const std::string reason = comm.transport_reason(p);
    // describe_peer() starts with the transport's name and ends with the reason; keep the rest.
    std::string link = comm.describe_peer(p);
    const std::string suffix = "; chosen as " + reason;
    if (link.size() >= suffix.size() &&
        link.compare(link.size() - suffix.size(), suffix.size(), suffix) == 0)
      link.resize(link.size() - suffix.size());
    if (link.rfind(name + " ", 0) == 0) link.erase(0, name.size() + 1);
    peers.push_back(json{{"peer", p}, {"transport", name}, {"reason", reason}, {"link", link}});
  }
  return json{{"rank", comm.rank()},
              {"host_id", anview::bootstrap::host_id()},
              {"pid", static_cast<int>(::getpid())},
              {"peers", peers}};
}

// The cells of one matrix row: the first padded to 9 columns, the others to 6; no trailing blanks.
std::string row_text(const std::vector<std::string>& cells) {
  std::string line;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const std::size_t width = i == 0 ? 9 : 6;
    line += cells[i] + std::string(width > cells[i].size() ? width - cells[i].size() : 1, ' ');
  }
  line.erase(line.find_last_not_of(' ') + 1);
  return line;
}

void print_plan(const json& plan) {
  const auto& ranks = plan["ranks"];
  const int size = plan["world_size"].get<int>();
  std::printf("anview %s: transport plan of %d rank%s (ANVIEW_TRANSPORTS=%s)\n", ANVIEW_VERSION,
              size, size == 1 ? "" : "s", plan["transports_setting"].get<std::string>().c_str());
  for (const auto& r : ranks) {
    std::printf("rank %d: host %s, pid %d\n", r["rank"].get<int>(),
                r["host_id"].get<std::string>().c_str(), r["pid"].get<int>());
  }
  if (size == 1) {
    std::printf("one rank: no peers to connect\n");
    return;
  }
  if (size <= 16) {  // a matrix of transport names, row: from, column: to
    std::vector<std::string> header{"from\\to"};
    for (int b = 0; b < size; ++b) header.push_back(std::to_string(b));
    std::printf("\n%s\n", row_text(header).c_str());
    for (const auto& r : ranks) {
      std::vector<std::string> row(static_cast<std::size_t>(size) + 1, "-");
      row[0] = std::to_string(r["rank"].get<int>());
      for (const auto& p : r["peers"])
        row[p["peer"].get<std::size_t>() + 1] = p["transport"].get<std::string>();
      std::printf("%s\n", row_text(row).c_str());
    }
  }
  std::printf("\n");
  for (const auto& r : ranks) {
    for (const auto& p : r["peers"]) {
      std::printf("rank %d -> rank %d: %s (%s): %s\n", r["rank"].get<int>(), p["peer"].get<int>(),
                  p["transport"].get<std::string>().c_str(), p["reason"].get<std::string>().c_str(),
                  p["link"].get<std::string>().c_str());
    }
  }
}

int print_peers(const Options& o) {
  if (o.emulate_hosts > 0) emulate_hosts(o.emulate_hosts);
  auto comm = anview::Communicator::from_env();
  const std::string mine = own_plan(comm).dump();
  if (comm.rank() != 0) {
    const std::uint64_t bytes = mine.size();
    comm.send(&bytes, sizeof bytes, 0, size_tag);
    comm.send(mine.data(), mine.size(), 0, data_tag);
    char done = 0;
    comm.recv(&done, 0, 0, done_tag);  // rank 0 has printed: leave together
    return 0;
  }
  json plan{{"world_size", comm.size()},
            {"transports_setting", setting_value("ANVIEW_TRANSPORTS")},
            {"emulated_hosts", o.emulate_hosts},
            {"ranks", json::array({json::parse(mine)})}};
  for (int r = 1; r < comm.size(); ++r) {
    std::uint64_t bytes = 0;
    comm.recv(&bytes, sizeof bytes, r, size_tag);
    std::string text(bytes, '\0');
    comm.recv(text.data(), text.size(), r, data_tag);
    plan["ranks"].push_back(json::parse(text));
  }
  if (o.json) {
    std::printf("%s\n", plan.dump(2).c_str());
  } else {
    print_plan(plan);
  }
  std::fflush(stdout);
  char done = 0;
  for (int r = 1; r < comm.size(); ++r) comm.send(&done, 0, r, done_tag);
  return 0;
}

// ---- --explain ----

int print_explain(const Options& o) {
  if (o.emulate_hosts > 0) emulate_hosts(o.emulate_hosts);
  const auto bytes = static_cast<std::size_t>(anview::base::parse_size(o.explain[1], "--explain"));
  auto comm = anview::Communicator::from_env();
  const std::string text = comm.explain_collective(o.explain[0], bytes);
  if (comm.rank() == 0) {
    std::printf("%s", text.c_str());
    std::fflush(stdout);
  }
  comm.barrier();  // rank 0 has printed: leave together
  return text.empty() ? 2 : 0;
}

// Asks each process for its dump (dump_service.hpp); prints them as one JSON array.
int print_dumps(const std::vector<std::string>& args) {
  using anview::detail::DumpService;
  std::vector<pid_t> pids;
  for (const std::string& a : args) {
    if (a.empty()) continue;  // CLI11 gives an empty value when --dump has none
    char* end = nullptr;
    const long pid = std::strtol(a.c_str(), &end, 10);
    if (*end != '\0' || pid <= 0) {
      std::cerr << "anview-info: --dump takes process ids, not '" << a << "'\n";
      return 2;
    }
    pids.push_back(static_cast<pid_t>(pid));
  }
  const bool all = pids.empty();
  if (all) pids = DumpService::listening_pids();
  if (pids.empty()) {
    std::cerr << "anview-info: no Anview process with a live communicator runs on this host (in "
                 "this network namespace)\n";
    return 1;
  }
  json out = json::array();
  int failed = 0;
  for (const pid_t pid : pids) {
    try {
      out.push_back(DumpService::request(pid, std::chrono::seconds(5)));
    } catch (const anview::Error& e) {
      ++failed;
      std::cerr << std::string("anview-info: ") + e.what() + "\n";
    }
  }
  std::printf("%s\n", out.dump(1).c_str());
  return failed == 0 || (all && !out.empty()) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "anview-info: version, build features, the transports usable on this machine (and why "
      "one is not), every setting with its value and where it came from; under a launcher "
      "with --peers, the transport each pair of ranks uses and why",
      "anview-info"};
  app.add_flag("--config", o.config, "print only the settings");
  app.add_flag("--peers", o.peers,
               "connect (run under a launcher: anview-run -n 4 anview-info --peers); rank 0 "
               "prints the per-peer transport plan");
  app.add_option("--emulate-hosts", o.emulate_hosts,
                 "with --peers: split the ranks over K emulated hosts (sets ANVIEW_HOST_ID), "
                 "so one machine shows the cross-host plan")
      ->check(CLI::PositiveNumber)
      ->type_name("K");
  app.add_option("--explain", o.explain,
                 "connect (under a launcher); rank 0 prints every algorithm the tuner considers "
                 "for COLLECTIVE of SIZE bytes (K/M/G suffixes), its predicted time, and the pick")
      ->expected(2)
      ->type_name("COLLECTIVE SIZE");
  app.add_flag("--json", o.json, "print JSON instead of text");
  auto* dump = app.add_option("--dump", o.dump_pids,
                              "print the flight recorders of the Anview processes running on this "
                              "host (or of these PIDs) as JSON")
                   ->expected(0, -1)
                   ->type_name("[PID...]");
  CLI11_PARSE(app, argc, argv);
  if (dump->count() > 0) {
    if (o.config || o.peers || !o.explain.empty()) {
      std::cerr << "anview-info: --dump goes alone\n";
      return 2;
    }
    return print_dumps(o.dump_pids);
  }
  const bool connects = o.peers || !o.explain.empty();
  if (o.emulate_hosts > 0 && !connects) {
    std::cerr << "anview-info: --emulate-hosts needs --peers or --explain\n";
    return 2;
  }
  if (o.config && connects) {
    std::cerr << "anview-info: --config goes alone (not with --peers or --explain)\n";
    return 2;
  }
  if (o.peers && !o.explain.empty()) {
    std::cerr << "anview-info: --peers and --explain do not go together\n";
    return 2;
  }
  if (!o.explain.empty() && o.json) {
    std::cerr << "anview-info: --explain prints text only\n";
    return 2;
  }

  try {
    if (!o.explain.empty()) return print_explain(o);
    return o.peers ? print_peers(o) : print_info(o);
  } catch (const anview::Error& e) {
    // One write per message: the ranks of a job share the terminal.
    std::string text = std::string("anview-info: ") + e.what() + "\n";
    if (connects && e.operation() == "bootstrap.detect_launch")
      text +=
          "anview-info: --peers and --explain run under a launcher, e.g. anview-run -n 4 "
          "anview-info --explain allreduce 64M\n";
    std::cerr << text;
    return e.kind() == anview::ErrorKind::usage ? 2 : 1;
  } catch (const std::exception& e) {
    std::cerr << std::string("anview-info: ") + e.what() + "\n";
    return 1;
  }
}
