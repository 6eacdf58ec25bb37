#include "transport/registry.hpp"

#include "base/config.hpp"
#include "transport/inproc/inproc_transport.hpp"
#include "transport/shm/shm_transport.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace anview::transport {
namespace {

const base::Setting transports_setting(
    "transport", "ANVIEW_TRANSPORTS", "shm,tcp",
    "Transports to use, in order of preference; each peer gets the first that reaches it "
    "(shm, tcp; inproc for ranks that are threads of one process)");

}  // namespace

std::vector<TransportProbe> probe_transports() {
  std::vector<TransportProbe> probes;
  const auto selected = transports_setting.as_list();
  for (const auto& name : known_transports()) {
    TransportProbe p = name == "shm"      ? shm::ShmTransport::probe()
                       : name == "tcp"    ? tcp::TcpTransport::probe()
                       : name == "inproc" ? inproc::InprocTransport::probe()
                                          : TransportProbe{.name = name};
    for (const auto& s : selected) p.selected = p.selected || s == name;
    probes.push_back(std::move(p));
  }
  return probes;
}

std::vector<std::string> known_transports() {
  return {"shm", "tcp", "inproc"};
}

std::vector<std::unique_ptr<Transport>> create_transports(const TransportContext& context) {
  std::vector<std::unique_ptr<Transport>> transports;
  for (const auto& name : transports_setting.as_list()) {
    if (name == "shm") {
      transports.push_back(std::make_unique<shm::ShmTransport>(context));
    } else if (name == "tcp") {
      transports.push_back(std::make_unique<tcp::TcpTransport>(context));
    } else if (name == "inproc") {
      transports.push_back(std::make_unique<inproc::InprocTransport>(context));
    } else {
      std::string known;
      for (const auto& k : known_transports()) known += (known.empty() ? "" : ", ") + k;
      throw Error(ErrorKind::usage, {.rank = context.rank,
                                     .operation = "transport.select",
                                     .cause = "ANVIEW_TRANSPORTS names '" + name +
                                              "', which this build does not "
                                              "have (known: " +
                                              known + ")"});
    }
  }
  if (transports.empty()) {
    throw Error(ErrorKind::usage, {.rank = context.rank,
                                   .operation = "transport.select",
                                   .cause = "ANVIEW_TRANSPORTS is empty"});
  }
  return transports;
}

Selection select_transport(const std::vector<std::unique_ptr<Transport>>& ordered, Transport& self,
                           const PeerInfo& peer) {
  std::string why_self;
  if (self.can_reach(peer, &why_self)) return {&self, "this process"};
  std::string rejected;
  for (const auto& t : ordered) {
    std::string why;
    if (t->can_reach(peer, &why)) {
      std::string reason =
          "first of ANVIEW_TRANSPORTS that reaches rank " + std::to_string(peer.rank);
      if (!rejected.empty()) reason += " (" + rejected + ")";
      return {t.get(), reason};
    }
    if (!rejected.empty()) rejected += "; ";
    rejected += std::string(t->name()) + ": " + why;
  }
  return {nullptr, "no transport reaches rank " + std::to_string(peer.rank) + ": " + rejected};
}

}  // namespace anview::transport
