#include "transport/registry.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <fstream>

#include "base/config.hpp"
#include "base/socket.hpp"
#include "bootstrap/interfaces.hpp"
#include "transport/shm/shm_transport.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace anview::transport {
namespace {

const base::Setting transports_setting(
    "transport", "ANVIEW_TRANSPORTS", "shm,tcp",
    "Transports to use, in order of preference; each peer gets the first that reaches it");

const base::Setting* find_setting(std::string_view env) {
  for (const base::Setting* s : base::all_settings())
    if (env == s->env()) return s;
  return nullptr;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// Cross-memory attach towards this very process: whether the kernel (CONFIG_CROSS_MEMORY_ATTACH)
// and a seccomp profile allow process_vm_readv at all. Reading a sibling rank can still be
// refused by Yama (see ptrace_note).
bool cross_memory_attach_works(std::string* why) {
  const std::uint64_t word = 0x616e766965772d31;  // "anview-1"
  std::uint64_t copy = 0;
  iovec local{&copy, sizeof copy};
  iovec remote{const_cast<std::uint64_t*>(&word), sizeof word};
  const ssize_t n = ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0);
  if (n == static_cast<ssize_t>(sizeof word) && copy == word) return true;
  *why = n < 0 ? "process_vm_readv: " + base::errno_text(errno)
               : std::string("process_vm_readv read the wrong bytes");
  return false;
}

// CAP_SYS_PTRACE in the effective set lets a rank read its siblings whatever Yama says.
bool has_cap_sys_ptrace() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    try {
      return (std::stoull(line.substr(7), nullptr, 16) >> 19) & 1;  // CAP_SYS_PTRACE = 19
    } catch (const std::exception&) {
      return false;
    }
  }
  return false;
}

// What kernel.yama.ptrace_scope means for ranks reading their siblings (they are siblings under
// every launcher, never parent and child).
std::string ptrace_note() {
  std::ifstream file("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (!(file >> scope)) {
    return "kernel.yama.ptrace_scope: no Yama here; ranks of the same user may read each other";
  }
  const std::string head = "kernel.yama.ptrace_scope=" + std::to_string(scope) + ": ";
  const bool cap = has_cap_sys_ptrace();
  if (scope == 0) return head + "ranks of the same user may read each other";
  if (scope <= 2 && cap) return head + "restricted, but this process has CAP_SYS_PTRACE";
  std::string text = head + (scope == 1   ? "only a process's descendants may read it"
                             : scope == 2 ? "only processes with CAP_SYS_PTRACE may read others"
                                          : "no process may read another");
  text +=
      ", so sibling ranks are refused single copy and large messages are copied through the "
      "ring (the transport says so at connect time)";
  if (scope <= 2) text += "; for single copy set it to 0 or give the ranks CAP_SYS_PTRACE";
  return text;
}

TransportProbe probe_shm() {
  TransportProbe p{.name = "shm"};
  std::string why;
  if (!shm::ShmTransport::usable_here(&why)) {
    p.detail = "cannot run here: " + why;
    return p;
  }
  p.usable = true;
  p.detail =
      "memfd, shared mappings and unix wake-up sockets work; reaches the ranks whose host id ";
  p.detail += "is " + bootstrap::host_id();
  const base::Setting* cma = find_setting("ANVIEW_SHM_CMA");
  const base::Setting* threshold = find_setting("ANVIEW_SHM_SINGLE_COPY_BYTES");
  const std::string above =
      threshold ? " above ANVIEW_SHM_SINGLE_COPY_BYTES=" + threshold->value() : std::string();
  if (cma && !cma->as_bool()) {
    p.notes.push_back("single copy (cross-memory attach): off (ANVIEW_SHM_CMA=" + cma->value() +
                      "); large messages are copied through the ring");
  } else if (!cross_memory_attach_works(&why)) {
    p.notes.push_back("single copy (cross-memory attach): unavailable (" + why +
                      ": a container's seccomp profile, or a kernel without "
                      "CONFIG_CROSS_MEMORY_ATTACH); large messages are copied through the ring");
  } else {
    p.notes.push_back("single copy (cross-memory attach)" + above +
                      ": process_vm_readv works on this process");
  }
  p.notes.push_back(ptrace_note());
  return p;
}

TransportProbe probe_tcp() {
  TransportProbe p{.name = "tcp"};
  std::vector<std::string> addresses;
  try {
    addresses = bootstrap::select_addresses(bootstrap::list_interfaces(),
                                            bootstrap::wanted_interfaces(), true);
  } catch (const Error& e) {
    p.detail = "no address to publish: " + e.cause();
    return p;
  }
  // As TcpTransport publishes them: IPv4 only for now.
  std::vector<std::string> published, skipped, remote;
  for (const auto& a : addresses) {
    if (a.find(':') != std::string::npos) {
      skipped.push_back(a);
      continue;
    }
    published.push_back(a);
    if (a.rfind("127.", 0) != 0) remote.push_back(a);
  }
  if (published.empty()) {
    p.detail = "no IPv4 address to publish (interfaces that are up: " +
               (addresses.empty() ? std::string("none") : join(addresses)) +
               "; check ANVIEW_IFACES)";
    return p;
  }
  p.usable = true;
  p.detail = "would publish " + join(published);
  if (remote.empty()) {
    p.notes.push_back("only loopback addresses: reaches ranks on this host only");
  } else if (remote.size() < published.size()) {
    p.notes.push_back("loopback addresses serve ranks on this host only");
  }
  if (!skipped.empty()) p.notes.push_back("IPv6 addresses not used (IPv4 only): " + join(skipped));
  return p;
}

}  // namespace

std::vector<TransportProbe> probe_transports() {
  std::vector<TransportProbe> probes;
  const auto selected = transports_setting.as_list();
  for (const auto& name : known_transports()) {
    TransportProbe p = name == "shm"   ? probe_shm()
                       : name == "tcp" ? probe_tcp()
                                       : TransportProbe{.name = name};
    for (const auto& s : selected) p.selected = p.selected || s == name;
    probes.push_back(std::move(p));
  }
  return probes;
}

std::vector<std::string> known_transports() { return {"shm", "tcp"}; }

std::vector<std::unique_ptr<Transport>> create_transports(const TransportContext& context) {
  std::vector<std::unique_ptr<Transport>> transports;
  for (const auto& name : transports_setting.as_list()) {
    if (name == "shm") {
      transports.push_back(std::make_unique<shm::ShmTransport>(context));
    } else if (name == "tcp") {
      transports.push_back(std::make_unique<tcp::TcpTransport>(context));
    } else {
      std::string known;
      for (const auto& k : known_transports()) known += (known.empty() ? "" : ", ") + k;
      throw Error(ErrorKind::usage,
                  {.rank = context.rank, .operation = "transport.select",
                   .cause = "ANVIEW_TRANSPORTS names '" + name + "', which this build does not "
                            "have (known: " + known + ")"});
    }
  }
  if (transports.empty()) {
    throw Error(ErrorKind::usage, {.rank = context.rank, .operation = "transport.select",
                                   .cause = "ANVIEW_TRANSPORTS is empty"});
  }
  return transports;
}

Selection select_transport(const std::vector<std::unique_ptr<Transport>>& ordered,
                           Transport& self, const PeerInfo& peer) {
  std::string why_self;
  if (self.can_reach(peer, &why_self)) return {&self, "this process"};
  std::string rejected;
  for (const auto& t : ordered) {
    std::string why;
    if (t->can_reach(peer, &why)) {
      std::string reason = "first of ANVIEW_TRANSPORTS that reaches rank " +
                           std::to_string(peer.rank);
      if (!rejected.empty()) reason += " (" + rejected + ")";
      return {t.get(), reason};
    }
    if (!rejected.empty()) rejected += "; ";
    rejected += std::string(t->name()) + ": " + why;
  }
  return {nullptr, "no transport reaches rank " + std::to_string(peer.rank) + ": " + rejected};
}

}  // namespace anview::transport
