#include "pubsub.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "rank_pair.hpp"
#include "sweep.hpp"

namespace perf {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

long run_pubsub(anview::Communicator& comm, const PubSubOptions& o) {
  long wrong = 0;
  if (comm.rank() == 1 && !o.json) {
    std::printf(
        "# anview-perf pubsub: rank 0 publishes, rank 1 subscribes (policy %s), %.1f s per size\n",
        o.policy == anview::Backpressure::block ? "block" : "drop_oldest", o.seconds);
    std::printf("%12s %14s %10s %12s %12s %10s\n", "size", "msgs_per_s", "GB/s", "delivered",
                "dropped", "#wrong");
  }
  for (std::size_t bytes : o.sizes) {
    std::vector<std::byte> payload(bytes);
    for (std::size_t i = 0; i < bytes; ++i) payload[i] = static_cast<std::byte>(i * 13 + 5);
    if (comm.rank() == 0) {
      anview::Publisher publisher = anview::Publisher::listen(o.listen);
      share_address(comm, publisher.address());
      comm.barrier();  // the subscriber is connected
      for (int i = 0; i < 10000 && publisher.subscribers() < 1; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const auto end = Clock::now() + seconds(o.warmup + o.seconds);
      const anview::Message message = anview::Message::view(payload.data(), payload.size());
      while (Clock::now() < end) {
        for (int i = 0; i < 64; ++i) publisher.publish("bench", message);
      }
      publisher.close();
    } else if (comm.rank() == 1) {
      const std::string address = share_address(comm, {});
      anview::Subscriber subscriber = anview::Subscriber::connect(address, {.policy = o.policy});
      comm.barrier();
      Clock::time_point first{}, last{};
      std::uint64_t counted = 0, counted_bytes = 0;
      Clock::time_point measure_from = Clock::time_point::max();
      while (auto d = subscriber.next()) {
        const auto now = Clock::now();
        if (measure_from == Clock::time_point::max()) measure_from = now + seconds(o.warmup);
        if (now >= measure_from) {
          if (counted == 0) first = now;
          last = now;
          ++counted;
          counted_bytes += d->message.size();
        }
        if (o.check && (d->message.size() != bytes ||
                        std::memcmp(d->message.bytes().data(), payload.data(), bytes) != 0))
          ++wrong;
      }
      const auto stats = subscriber.stats();
      if (o.policy == anview::Backpressure::block) wrong += static_cast<long>(stats.dropped);
      const double span = std::chrono::duration<double>(last - first).count();
      const double rate = counted > 1 && span > 0 ? static_cast<double>(counted - 1) / span : 0;
      const double gbs =
          counted > 1 && span > 0 ? static_cast<double>(counted_bytes - bytes) / span / 1e9 : 0;
      if (o.json) {
        nlohmann::json j{
            {"op", "pubsub"},
            {"bytes", bytes},
            {"msgs_per_s", rate},
            {"gbs", gbs},
            {"delivered", stats.delivered},
            {"dropped", stats.dropped},
            {"policy", o.policy == anview::Backpressure::block ? "block" : "drop_oldest"},
            {"wrong", wrong}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%12s %14.0f %10.3f %12llu %12llu %10ld\n", human_size(bytes).c_str(), rate,
                    gbs, static_cast<unsigned long long>(stats.delivered),
                    static_cast<unsigned long long>(stats.dropped), wrong);
      }
      std::fflush(stdout);
    } else {
      share_address(comm, {});
      comm.barrier();
    }
    comm.barrier();
  }
  wrong = share_verdict(comm, wrong, 1);
  return wrong;
}

}  // namespace perf
