#include "transport/registry.hpp"

#include "base/config.hpp"
#include "base/log.hpp"
#include "transport/inproc/inproc_transport.hpp"
#include "transport/shm/shm_transport.hpp"
#include "transport/tcp/tcp_transport.hpp"
#if defined(ANVIEW_HAVE_UCX)
#include "transport/ucx/ucx_transport.hpp"
#endif

namespace anview::transport {
namespace {

#if defined(ANVIEW_HAVE_UCX)
constexpr const char* default_transports = "shm,ucx,tcp";
#else
constexpr const char* default_transports = "shm,tcp";
#endif

const base::Setting transports_setting(
    "transport", "ANVIEW_TRANSPORTS", default_transports,
    "Transports to use, in order of preference; each peer gets the first that reaches it "
    "(shm, ucx in builds with UCX, tcp; inproc for ranks that are threads of one process). By "
    "default ucx serves peers on other hosts only where UCX drives an RDMA device; naming it "
    "here makes it serve every peer it reaches, over the devices UCX_TLS allows");

}  // namespace

std::vector<TransportProbe> probe_transports() {
  std::vector<TransportProbe> probes;
  const auto selected = transports_setting.as_list();
  for (const auto& name : known_transports()) {
    TransportProbe p = name == "shm"      ? shm::ShmTransport::probe()
                       : name == "tcp"    ? tcp::TcpTransport::probe()
                       : name == "inproc" ? inproc::InprocTransport::probe()
#if defined(ANVIEW_HAVE_UCX)
                       : name == "ucx" ? ucx::UcxTransport::probe()
#endif
                                       : TransportProbe{.name = name};
    for (const auto& s : selected) p.selected = p.selected || s == name;
    probes.push_back(std::move(p));
  }
  return probes;
}

std::vector<std::string> known_transports() {
#if defined(ANVIEW_HAVE_UCX)
  return {"shm", "ucx", "tcp", "inproc"};
#else
  return {"shm", "tcp", "inproc"};
#endif
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
#if defined(ANVIEW_HAVE_UCX)
    } else if (name == "ucx") {
      // In the default list, ucx is only worth a UCP context where UCX drives RDMA; a user
      // who names it gets it whatever the devices.
      const bool forced = transports_setting.from_environment();
      std::string why;
      if (!forced && !ucx::UcxTransport::rdma_present(&why)) {
        base::log("transport", base::LogLevel::debug, "ucx left out: ", why);
        continue;
      }
      transports.push_back(std::make_unique<ucx::UcxTransport>(context, forced));
#endif
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
