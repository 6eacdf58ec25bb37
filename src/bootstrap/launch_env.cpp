#include "bootstrap/launch_env.hpp"

#include <arpa/inet.h>

#include <cctype>
#include <charconv>
#include <cstdlib>

#include "anview/error.hpp"
#include "base/socket.hpp"

namespace anview::bootstrap {
namespace {

struct Launcher {
  const char* name;
  const char* rank;
  const char* world_size;
  const char* step_world_size;  // when set, wins over world_size (nullptr: none)
  const char* local_rank;
  bool local_rank_optional;  // defaults to the rank when absent
  bool root_needs_anview;    // only ANVIEW_ROOT names the root (no MASTER_ADDR fallback)
  bool root_from_nodelist;   // without MASTER_ADDR: rank 0's node from Slurm's node list
};

// In the order they are tried.
constexpr Launcher launchers[] = {
    {.name = "anview",
     .rank = "ANVIEW_RANK",
     .world_size = "ANVIEW_WORLD_SIZE",
     .step_world_size = nullptr,
     .local_rank = "ANVIEW_LOCAL_RANK",
     .local_rank_optional = true,
     .root_needs_anview = true,
     .root_from_nodelist = false},
    {.name = "torchrun",
     .rank = "RANK",
     .world_size = "WORLD_SIZE",
     .step_world_size = nullptr,
     .local_rank = "LOCAL_RANK",
     .local_rank_optional = false,
     .root_needs_anview = false,
     .root_from_nodelist = false},
    {.name = "openmpi",
     .rank = "OMPI_COMM_WORLD_RANK",
     .world_size = "OMPI_COMM_WORLD_SIZE",
     .step_world_size = nullptr,
     .local_rank = "OMPI_COMM_WORLD_LOCAL_RANK",
     .local_rank_optional = false,
     .root_needs_anview = false,
     .root_from_nodelist = false},
    {.name = "slurm",
     .rank = "SLURM_PROCID",
     .world_size = "SLURM_NTASKS",
     // srun --preserve-env (salloc's interactive step among them) keeps the allocation's
     // SLURM_NTASKS; the step's own count is the job's size.
     .step_world_size = "SLURM_STEP_NUM_TASKS",
     .local_rank = "SLURM_LOCALID",
     .local_rank_optional = false,
     .root_needs_anview = false,
     .root_from_nodelist = true},
};

[[noreturn]] void usage(const Launcher& l, const std::string& cause) {
  throw Error(ErrorKind::usage, {.operation = "bootstrap.detect_launch",
                                 .cause = cause + " (" + l.name + " launch)"});
}

std::optional<std::string> lookup(const EnvLookup& getenv, const char* name) {
  auto v = getenv(name);
  if (v && v->empty()) return std::nullopt;  // set but empty counts as missing
  return v;
}

std::string require(const EnvLookup& getenv, const Launcher& l, const char* name) {
  auto v = lookup(getenv, name);
  if (!v) usage(l, std::string(name) + " is not set");
  return *v;
}

// Strict: decimal digits (with an optional '-' where T is signed), nothing else, within T.
template <typename T>
T parse_integer(const Launcher& l, const char* name, const std::string& text) {
  T value = 0;
  const char* first = text.data();
  const char* last = first + text.size();
  const auto [ptr, ec] = std::from_chars(first, last, value);
  if (ec == std::errc::result_out_of_range)
    usage(l, std::string(name) + "='" + text + "' is out of range");
  if (ec != std::errc() || ptr != last || first == last)
    usage(l, std::string(name) + "='" + text + "' is not an integer");
  return value;
}

// A heterogeneous Slurm job (SLURM_PACK_SIZE before Slurm 20.02).
bool slurm_heterogeneous(const EnvLookup& getenv) {
  return lookup(getenv, "SLURM_HET_SIZE") || lookup(getenv, "SLURM_PACK_SIZE");
}

// Checks "host:port" / "[v6]:port" without resolving the host.
void check_host_port(const Launcher& l, const char* name, const std::string& text) {
  std::string host;
  std::uint16_t port = 0;
  if (!base::split_host_port(text, &host, &port) || port == 0)
    usage(l, std::string(name) + "='" + text +
                 "' is not host:port (\"10.0.0.1:29500\", "
                 "\"[fe80::1]:29500\")");
}

int parse_port(const Launcher& l, const std::string& text) {
  const int p = parse_integer<int>(l, "MASTER_PORT", text);
  if (p < 1 || p > 65535) usage(l, "MASTER_PORT=" + text + " is not a port (1..65535)");
  return p;
}

// Under srun with neither ANVIEW_ROOT nor MASTER_ADDR: Slurm starts task 0 on the first node of
// the step (block, cyclic and plane distributions alike), so every rank can name rank 0's node
// from the step's node list; the port comes from the job and step ids unless MASTER_PORT gives
// one. Only srun sets the step's list: a batch script's own process also has SLURM_PROCID=0
// and the allocation's SLURM_NTASKS, and would wait for ranks nobody started.
std::string slurm_root(const EnvLookup& getenv, const Launcher& l, int rank,
                       const std::optional<std::string>& port, std::string* source,
                       std::string* job_name) {
  const char* list_name = "SLURM_STEP_NODELIST";
  if (slurm_heterogeneous(getenv))
    usage(l,
          "ANVIEW_ROOT is not set, nor MASTER_ADDR: in a heterogeneous job (SLURM_HET_SIZE) each "
          "component has a node list of its own, and rank 0's node cannot be told from this "
          "one's; set MASTER_ADDR and MASTER_PORT, or ANVIEW_ROOT");
  const auto list = lookup(getenv, list_name);
  if (!list)
    usage(l,
          "ANVIEW_ROOT is not set, nor MASTER_ADDR and MASTER_PORT, nor SLURM_STEP_NODELIST, "
          "which srun sets (not started by srun? a batch script's own process has SLURM_PROCID "
          "but no step): start the ranks with srun, or set MASTER_ADDR and MASTER_PORT, or "
          "ANVIEW_ROOT");
  const auto host = first_slurm_host(*list);
  if (!host) usage(l, std::string(list_name) + "='" + *list + "' is not a Slurm host list");
  const auto job = lookup(getenv, "SLURM_JOB_ID");
  const auto step = lookup(getenv, "SLURM_STEP_ID");
  const std::uint64_t job_id = job ? parse_integer<std::uint64_t>(l, "SLURM_JOB_ID", *job) : 0;
  const std::uint64_t step_id = step ? parse_integer<std::uint64_t>(l, "SLURM_STEP_ID", *step) : 0;
  // Jobs that share the first node may find the same port: the name tells them apart.
  if (job) *job_name = "slurm job " + std::to_string(job_id) + " step " + std::to_string(step_id);
  int p = 0;
  if (port) {
    p = parse_port(l, *port);
    *source = std::string("the first node of ") + list_name + ", the port from MASTER_PORT";
  } else {
    if (!job)
      usage(l, std::string("SLURM_JOB_ID is not set: it chooses the root's port (on the first "
                           "node of ") +
                   list_name + "); or set MASTER_PORT, or ANVIEW_ROOT");
    // 20000..29999, below Linux's ephemeral ports: consecutive jobs and steps differ.
    p = 20000 + static_cast<int>(job_id % 1000 * 10 + step_id % 10);
    *source = std::string("the first node of ") + list_name +
              ", the port from SLURM_JOB_ID and SLURM_STEP_ID";
  }
  // A distribution that does not start on the first node (arbitrary, from a host file) puts
  // rank 0 elsewhere: say so here rather than fail to listen on another node's address.
  if (const auto node = lookup(getenv, "SLURMD_NODENAME"); rank == 0 && node && *node != *host)
    usage(l, "rank 0 runs on node " + *node + ", not on " + *host + ", the first node of " +
                 list_name + " (a task distribution that does not start there): set " +
                 "MASTER_ADDR and MASTER_PORT, or ANVIEW_ROOT, to rank 0's node and a free port");
  *source += "; ANVIEW_ROOT, or MASTER_ADDR and MASTER_PORT, choose another";
  const std::string root = *host + ":" + std::to_string(p);
  check_host_port(l, list_name, root);
  return root;
}

std::string find_root(const EnvLookup& getenv, const Launcher& l, int rank, std::string* source,
                      std::string* job) {
  if (auto root = lookup(getenv, "ANVIEW_ROOT")) {
    check_host_port(l, "ANVIEW_ROOT", *root);
    return *root;
  }
  if (l.root_needs_anview) usage(l, "ANVIEW_ROOT is not set");
  // torchrun's agent serves PyTorch's own store on MASTER_PORT when it says so (its static
  // rendezvous, the default): rank 0 could not listen there, and the others would speak to
  // PyTorch's store.
  if (const auto agent = lookup(getenv, "TORCHELASTIC_USE_AGENT_STORE");
      agent && (*agent == "True" || *agent == "true" || *agent == "1"))
    usage(l,
          "ANVIEW_ROOT is not set, and MASTER_ADDR:MASTER_PORT is torchrun's own store "
          "(TORCHELASTIC_USE_AGENT_STORE=" +
              *agent +
              "): set ANVIEW_ROOT=host:port to a free port on the host of rank 0, or use "
              "anview.torch, which shares PyTorch's store");
  const auto addr = lookup(getenv, "MASTER_ADDR");
  const auto port = lookup(getenv, "MASTER_PORT");
  if (!addr && l.root_from_nodelist) return slurm_root(getenv, l, rank, port, source, job);
  if (!addr && !port) usage(l, "ANVIEW_ROOT is not set, nor MASTER_ADDR and MASTER_PORT");
  if (!addr) usage(l, "MASTER_ADDR is not set (MASTER_PORT is)");
  if (!port) usage(l, "MASTER_PORT is not set (MASTER_ADDR is)");
  const int p = parse_port(l, *port);
  const bool v6 = addr->find(':') != std::string::npos && addr->front() != '[';
  const std::string root = (v6 ? "[" + *addr + "]" : *addr) + ":" + std::to_string(p);
  std::string host;
  std::uint16_t parsed = 0;
  if (!base::split_host_port(root, &host, &parsed))
    usage(l, "MASTER_ADDR='" + *addr + "' is not a host name or an IP address");
  return root;
}

LaunchInfo read_launcher(const EnvLookup& getenv, const Launcher& l, const std::string& rank) {
  LaunchInfo info;
  info.launcher = l.name;
  info.rank = parse_integer<int>(l, l.rank, rank);
  // A heterogeneous job: SLURM_NTASKS as before (what its components' SLURM_STEP_NUM_TASKS
  // count is not relied on).
  const bool heterogeneous = l.root_from_nodelist && slurm_heterogeneous(getenv);
  const char* world_name =
      l.step_world_size != nullptr && !heterogeneous && lookup(getenv, l.step_world_size)
          ? l.step_world_size
          : l.world_size;
  info.world_size = parse_integer<int>(l, world_name, require(getenv, l, world_name));
  if (info.world_size < 1)
    usage(l, std::string(world_name) + "=" + std::to_string(info.world_size) +
                 " is not a world size (at least 1)");
  if (info.rank < 0 || info.rank >= info.world_size)
    usage(l, std::string(l.rank) + "=" + std::to_string(info.rank) + " is not in [0, " +
                 world_name + "=" + std::to_string(info.world_size) + ")");
  const auto local = l.local_rank_optional ? lookup(getenv, l.local_rank)
                                           : std::optional(require(getenv, l, l.local_rank));
  info.local_rank = local ? parse_integer<int>(l, l.local_rank, *local) : info.rank;
  if (info.local_rank < 0 || info.local_rank >= info.world_size)
    usage(l, std::string(l.local_rank) + "=" + std::to_string(info.local_rank) + " is not in [0, " +
                 world_name + "=" + std::to_string(info.world_size) + ")");
  info.root = find_root(getenv, l, info.rank, &info.root_source, &info.job);
  return info;
}

bool slurm_host_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

}  // namespace

std::optional<std::string> first_slurm_host(std::string_view list) {
  std::string host;
  for (std::size_t i = 0; i < list.size() && list[i] != ',';) {
    if (list[i] != '[') {
      if (!slurm_host_char(list[i])) return std::nullopt;
      host += list[i++];
      continue;
    }
    // "[07-09,12]": the first number as written (zero padding kept).
    const std::size_t close = list.find(']', i);
    if (close == std::string_view::npos || close == i + 1) return std::nullopt;
    const std::string_view ranges = list.substr(i + 1, close - i - 1);
    for (const char c : ranges)
      if (!std::isdigit(static_cast<unsigned char>(c)) && c != '-' && c != ',') return std::nullopt;
    const std::string_view first = ranges.substr(0, ranges.find_first_of("-,"));
    if (first.empty()) return std::nullopt;
    host += first;
    i = close + 1;
  }
  if (host.empty()) return std::nullopt;
  return host;
}

LaunchInfo detect_launch(const EnvLookup& getenv) {
  for (const Launcher& l : launchers)
    if (auto rank = lookup(getenv, l.rank)) return read_launcher(getenv, l, *rank);
  std::string looked;
  for (const Launcher& l : launchers) {
    if (!looked.empty()) looked += ", ";
    looked += std::string(l.rank) + " (" + l.name + ")";
  }
  throw Error(ErrorKind::usage,
              {.operation = "bootstrap.detect_launch",
               .cause = "no launcher found: none of " + looked +
                        " is set; start the ranks with anview-run, torchrun, mpirun or srun, "
                        "or set ANVIEW_RANK, ANVIEW_WORLD_SIZE and ANVIEW_ROOT"});
}

EmulatedHost emulated_host(int rank, int world, int hosts) {
  const auto at = [&](int host) {  // host h's first rank: the least r with r*hosts/world >= h
    return static_cast<int>((static_cast<long>(host) * world + hosts - 1) / hosts);
  };
  const int host = static_cast<int>(static_cast<long>(rank) * hosts / world);
  return {.id = "emulated-host-" + std::to_string(host),
          .first_rank = at(host),
          .ranks = at(host + 1) - at(host)};
}

bool serve_everywhere(const std::string& host, const std::string& resolved_host) {
  in6_addr any{};
  const bool literal = ::inet_pton(AF_INET, host.c_str(), &any) == 1 ||
                       ::inet_pton(AF_INET6, host.c_str(), &any) == 1;
  const bool localhost = host == "localhost" || host.ends_with(".localhost") ||
                         host == "ip6-localhost" || host == "ip6-loopback";
  const bool loopback = resolved_host.starts_with("127.") || resolved_host == "::1" ||
                        resolved_host.starts_with("::ffff:127.");
  return !host.empty() && !literal && !localhost && loopback;
}

ServeAddress store_serve_address(const std::string& root, int rank) {
  std::string host;
  std::uint16_t port = 0;
  if (!base::split_host_port(root, &host, &port)) return {.address = root};  // serving says why
  const base::SockAddr resolved = base::SockAddr::parse(
      root, {.rank = rank, .peer_address = root, .operation = "bootstrap.serve_store"});
  if (!serve_everywhere(host, resolved.host())) return {.address = root};
  const bool v6 = resolved.family() == AF_INET6;
  return {.address = (v6 ? "[::]:" : "0.0.0.0:") + std::to_string(port),
          .why = "the root's host '" + host + "' resolves to " + resolved.host() +
                 " here, a loopback address (/etc/hosts maps this machine's name there), "
                 "where ranks on other hosts could not reach it: serving the store on every " +
                 (v6 ? "IPv6" : "IPv4") + " address at port " + std::to_string(port) +
                 " instead (set ANVIEW_ROOT to this host's network address to choose one)"};
}

LaunchInfo detect_launch() {
  return detect_launch([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace anview::bootstrap
