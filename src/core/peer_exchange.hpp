// Address exchange through the store: each rank publishes its PeerInfo as JSON under
// "<prefix>/peer/<rank>" and reads everyone else's.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "anview/store.hpp"
#include "transport/transport.hpp"

namespace anview::detail {

std::string encode_peer_info(const transport::PeerInfo& info);
// Raises a protocol Error naming the rank when the text is not a valid record.
transport::PeerInfo decode_peer_info(const std::string& text, int expected_rank, int my_rank);

std::vector<transport::PeerInfo> exchange_peer_info(Store& store, const std::string& prefix,
                                                    const transport::PeerInfo& self, int size,
                                                    std::chrono::milliseconds timeout);

}  // namespace anview::detail
