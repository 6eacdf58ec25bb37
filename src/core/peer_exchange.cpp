#include "core/peer_exchange.hpp"

#include <nlohmann/json.hpp>

namespace anview::detail {

std::string encode_peer_info(const transport::PeerInfo& info) {
  nlohmann::json j;
  j["rank"] = info.rank;
  j["host_id"] = info.host_id;
  j["pid"] = info.pid;
  j["tcp"] = info.tcp_addresses;
  j["endpoints"] = info.endpoints;
  return j.dump();
}

transport::PeerInfo decode_peer_info(const std::string& text, int expected_rank, int my_rank) {
  try {
    const auto j = nlohmann::json::parse(text);
    transport::PeerInfo info;
    info.rank = j.at("rank").get<int>();
    info.host_id = j.at("host_id").get<std::string>();
    info.pid = j.value("pid", 0);
    info.tcp_addresses = j.at("tcp").get<std::vector<std::string>>();
    if (j.contains("endpoints"))
      info.endpoints = j.at("endpoints").get<std::map<std::string, std::string>>();
    if (info.rank != expected_rank) throw std::runtime_error("rank field does not match its key");
    return info;
  } catch (const std::exception& e) {
    throw Error(ErrorKind::protocol,
                {.rank = my_rank, .peer = expected_rank, .operation = "bootstrap",
                 .cause = "the store's address record of rank " + std::to_string(expected_rank) +
                          " is not valid: " + e.what()});
  }
}

std::vector<transport::PeerInfo> exchange_peer_info(Store& store, const std::string& prefix,
                                                    const transport::PeerInfo& self, int size,
                                                    std::chrono::milliseconds timeout) {
  store.set(prefix + "/peer/" + std::to_string(self.rank), encode_peer_info(self));
  std::vector<transport::PeerInfo> peers;
  peers.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (r == self.rank) {
      peers.push_back(self);
      continue;
    }
    std::string record;
    try {
      record = store.get_string(prefix + "/peer/" + std::to_string(r), timeout);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::timeout) throw;
      throw Error(ErrorKind::timeout,
                  {.rank = self.rank, .peer = r, .operation = "bootstrap",
                   .cause = "rank " + std::to_string(r) + " did not publish its addresses within " +
                            std::to_string(timeout.count()) + " ms (is it running, with the same "
                            "world size and root?): " + e.cause()});
    }
    peers.push_back(decode_peer_info(record, r, self.rank));
  }
  return peers;
}

}  // namespace anview::detail
