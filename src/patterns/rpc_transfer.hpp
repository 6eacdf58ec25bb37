// Moving an RPC message's parts: the first message carries the frame (rpc_frame.hpp); the
// payload (when not inline) and each tensor follow as messages of their own on the call's
// body tag, sent straight from the Message's memory and received into buffers it owns.
#pragma once

#include <vector>

#include "anview/communicator.hpp"
#include "anview/message.hpp"
#include "patterns/rpc_frame.hpp"

namespace anview::patterns::rpc {

// Posts the receives of `frame`'s body parts from `peer` on `tag` into buffers `message` then
// owns (the inline payload is copied); returns them, in order.
std::vector<Request> receive_body(Communicator& comm, int peer, Tag tag, const Frame& frame,
                                  Message& message);

// Sends `frame` on `frame_tag`, then the body parts of `message` on `body_tag`; the frame and
// the message stay alive until every send completes. Returns the body parts' sends (they read
// the message's memory until they complete). Raises the first send's Error.
std::vector<Request> send_with_body(Communicator& comm, int peer, Tag frame_tag, Tag body_tag,
                                    std::vector<std::byte> frame, const Message& message,
                                    bool payload_inline);

}  // namespace anview::patterns::rpc
