#include "patterns/connection.hpp"

#include <utility>

#include "base/log.hpp"
#include "base/timeouts.hpp"

namespace anview::patterns {
namespace {

constexpr const char* service_key = "anview/service";
// A client that took a number and vanished before claiming it is skipped after this long.
constexpr auto unclaimed_grace = std::chrono::seconds(5);
constexpr auto accept_poll = std::chrono::milliseconds(200);

std::string conn_key(const std::string& service, std::uint64_t id) {
  return service + "/conn/" + std::to_string(id);
}

CommunicatorOptions connection_options(const std::string& service, std::uint64_t id,
                                       std::chrono::milliseconds timeout) {
  return {.timeout = timeout,
          .store_prefix = service + "/c" + std::to_string(id),
          .names_process = false};
}

}  // namespace

bool wait_unless_stopping(Request& request, const std::atomic<bool>& stopping) {
  constexpr auto slice = std::chrono::milliseconds(100);
  for (;;) {
    try {
      request.wait(slice);
      return true;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::timeout) throw;
      if (stopping.load(std::memory_order_acquire)) return false;
    }
  }
}

void send_owned(Communicator& comm, int peer, Tag tag, std::vector<std::byte> bytes,
                std::function<void()> done) {
  auto held = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  comm.isend(held->data(), held->size(), peer, tag)
      .on_complete([held, done = std::move(done)](const Status&, const Error*) {
        if (done) done();
      });
}

void cancel_or_finish(Request& request) {
  if (request.cancel()) return;
  try {
    request.wait(std::chrono::seconds(1));
  } catch (const Error& e) {
    // Failed (then it is complete), or still running after a second: then it is abandoned,
    // which closes the link, so that nothing writes into its buffer once this returns.
    if (!request.done()) request.abandon(e);
  }
}

Listener::Listener(const std::string& host_port, std::string service,
                   std::chrono::milliseconds timeout, Serve serve)
    : service_(std::move(service)),
      timeout_(base::timeout_or_default(timeout)),
      serve_(std::move(serve)),
      store_(Store::serve_tcp(host_port, {.timeout = timeout_})),
      address_(store_.address()) {
  store_.set(service_key, service_);
  acceptor_ = std::thread([this] { accept_loop(); });
}

Listener::~Listener() {
  stop();
}

void Listener::stop() {
  request_stop();
  std::lock_guard stop_lock(stop_mu_);
  if (std::exchange(joined_, true)) return;
  if (acceptor_.joinable()) acceptor_.join();
  std::list<Worker> workers;
  {
    std::lock_guard lock(mu_);
    workers.swap(workers_);
  }
  for (auto& w : workers) w.thread.join();
}

void Listener::accept_loop() {
  std::uint64_t next = 1;
  // Since when the number `next` has been taken (the counter is past it) but not claimed.
  auto missing_since = std::chrono::steady_clock::time_point::max();
  // The store is reached over loopback, also from here: a timeout (a loaded machine) is tried
  // again; any other failure ends accepting.
  auto fatal = [&](const Error& e) {
    if (e.kind() == ErrorKind::timeout) return false;
    base::log(service_.c_str(), base::LogLevel::error, "listener at ", address_,
              " stops accepting: ", e.what());
    return true;
  };
  while (!stopping()) {
    try {
      store_.wait({conn_key(service_, next)}, accept_poll);
      start_connection(next++);
      missing_since = std::chrono::steady_clock::time_point::max();
      continue;
    } catch (const Error& e) {
      if (fatal(e)) return;
    }
    reap_finished();
    // A client that took number `next` and died before claiming it must not block the ones
    // after it.
    std::uint64_t taken = 0;
    try {
      taken = static_cast<std::uint64_t>(store_.add(service_ + "/clients", 0));
    } catch (const Error& e) {  // nothing escapes this thread (that is std::terminate)
      if (fatal(e)) return;
      continue;
    }
    if (taken > next) {
      const auto now = std::chrono::steady_clock::now();
      if (missing_since == std::chrono::steady_clock::time_point::max()) {
        missing_since = now;
      } else if (now - missing_since > unclaimed_grace) {
        base::log(service_.c_str(), base::LogLevel::warn, "connection ", next, " to ", address_,
                  " was never claimed; skipped");
        ++next;
        missing_since = std::chrono::steady_clock::time_point::max();
      }
    }
  }
}

void Listener::start_connection(std::uint64_t id) {
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::lock_guard lock(mu_);
  workers_.push_back({std::thread([this, id, finished] {
                        try {
                          auto comm = Communicator::create(
                              0, 2, store_, connection_options(service_, id, timeout_));
                          base::log(service_.c_str(), base::LogLevel::debug, "connection ", id,
                                    " accepted over ", comm.transport_name(1));
                          serve_(std::move(comm), id);
                        } catch (const std::exception& e) {
                          base::log(service_.c_str(), base::LogLevel::info, "connection ", id,
                                    " to ", address_, " ended: ", e.what());
                        }
                        finished->store(true, std::memory_order_release);
                      }),
                      finished});
}

void Listener::reap_finished() {
  std::list<Worker> done;
  {
    std::lock_guard lock(mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {
      auto cur = it++;
      if (cur->finished->load(std::memory_order_acquire)) done.splice(done.end(), workers_, cur);
    }
  }
  for (auto& w : done) w.thread.join();
}

Communicator connect_to(const std::string& address, const std::string& service,
                        std::chrono::milliseconds timeout) {
  timeout = base::timeout_or_default(timeout);
  Store store = Store::connect_tcp(address, {.timeout = timeout});
  const std::string kind = store.get_string(service_key, timeout);
  if (kind != service) {
    throw Error(ErrorKind::usage, {.peer_address = address,
                                   .operation = service + " connect",
                                   .cause = address + " serves " + kind + ", not " + service});
  }
  const auto id = static_cast<std::uint64_t>(store.add(service + "/clients", 1));
  store.set(conn_key(service, id), std::string("1"));
  return Communicator::create(1, 2, std::move(store), connection_options(service, id, timeout));
}

}  // namespace anview::patterns
