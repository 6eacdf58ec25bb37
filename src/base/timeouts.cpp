#include "base/timeouts.hpp"

namespace anview::base {
namespace {

const Setting timeout(
    "base", "ANVIEW_TIMEOUT", "300",
    "Default deadline of every blocking call (seconds; ms/us/m suffixes allowed)");

}  // namespace

const Setting& timeout_setting() {
  return timeout;
}

}  // namespace anview::base
