#include "anview/communicator.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "base/log.hpp"
#include "base/random.hpp"
#include "base/timeouts.hpp"
#include "base/trace.hpp"
#include "bootstrap/interfaces.hpp"
#include "bootstrap/launch_env.hpp"
#include "core/communicator_impl.hpp"
#include "core/dump_service.hpp"
#include "core/metrics_server.hpp"
#include "core/peer_exchange.hpp"

namespace anview {
namespace detail {
namespace {

std::uint64_t agree_on_job_id(Store& store, const std::string& prefix, int rank,
                              std::chrono::milliseconds timeout) {
  const std::string key = prefix + "/job_id";
  if (rank == 0) {
    const std::uint64_t id = base::random_u64();
    store.set(key, std::to_string(id));
    return id;
  }
  const std::string text = store.get_string(key, timeout);
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    throw Error(ErrorKind::protocol,
                {.rank = rank,
                 .operation = "bootstrap",
                 .cause = "the store's job id '" + text + "' is not a number"});
  }
}

}  // namespace

CommunicatorImpl::CommunicatorImpl(int rank, int size, Store store,
                                   const CommunicatorOptions& options)
    : store_(std::move(store)),
      prefix_(options.store_prefix),
      names_process_(options.names_process) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(ErrorKind::usage,
                {.rank = rank,
                 .operation = "create",
                 .cause = "rank " + std::to_string(rank) + " is not in a communicator of size " +
                          std::to_string(size)});
  }
  if (names_process_) base::set_log_rank(rank);
  const auto timeout = base::timeout_or_default(options.timeout);
  p2p::MessengerConfig config{
      .rank = rank,
      .world_size = size,
      .job_id = agree_on_job_id(store_, options.store_prefix, rank, timeout),
      .host_id = options.host_id.empty() ? bootstrap::host_id() : options.host_id,
      .timeout = timeout,
      .name = options.store_prefix};
  messenger_ = std::make_shared<p2p::Messenger>(config);
  doctor_ = std::make_unique<HangDoctor>(store_, prefix_, rank, size);
  collectives_ = std::make_unique<collectives::Collectives>(*messenger_);
  collectives_->set_stall_reporter(doctor_.get());
  messenger_->set_stall_hook([doctor = doctor_.get()](const std::string& report) {
    doctor->remember(report);  // the messenger logged it
    DumpService::instance().write(report);
  });
  const auto peers =
      exchange_peer_info(store_, options.store_prefix, messenger_->self_info(), size, timeout);
  messenger_->connect(peers);
  dump_source_ = DumpService::instance().add([this] { return state(); });
  if (base::Trace* trace = base::Trace::active()) trace->open(config.job_id, rank);
  if (names_process_) MetricsServer::instance().attach(rank);
}

CommunicatorImpl::~CommunicatorImpl() {
  if (names_process_) MetricsServer::instance().detach();
  DumpService::instance().remove(dump_source_);
  worker_started_.store(nullptr, std::memory_order_relaxed);
  worker_.reset();  // its collectives use collectives_ and the messenger
  messenger_->shutdown();
  if (base::Trace* trace = base::Trace::active()) trace->close();  // the last one writes it
}

namespace {

// Runs a collective's job; when it fails, the flight recorder's dump is written first. Every
// path runs jobs through it: here for a blocking call, on the worker for the others.
template <typename Job>
void run_dumping_on_error(Job& job) {
  try {
    job();
  } catch (const Error& e) {
    CommunicatorImpl::dump_after(e);
    throw;
  }
}

std::function<void()> dumping_on_error(std::function<void()> job) {
  return [job = std::move(job)] { run_dumping_on_error(job); };
}

}  // namespace

template <typename Job>
void CommunicatorImpl::run_collective(const char* name, Job&& job) {
  CollectiveWorker* worker = worker_started_.load(std::memory_order_acquire);
  if (worker == nullptr) return run_dumping_on_error(job);  // no allocation on this path
  auto request = messenger_->external_request(name);
  worker->submit(request, 0, dumping_on_error(std::function<void()>(std::forward<Job>(job))),
                 /*caller_waits=*/true);
  // Each step of the collective has its own deadline: wait for as long as it runs.
  for (;;) {
    try {
      messenger_->wait(*request, messenger_->default_timeout());
      return;
    } catch (const Error&) {
      if (request->done.load(std::memory_order_acquire)) throw;  // the collective's own Error
    }
  }
}

Request CommunicatorImpl::start_collective(const char* name, std::size_t bytes,
                                           std::function<void()> job) {
  auto request = messenger_->external_request(name);
  {
    std::lock_guard lock(worker_mu_);
    if (!worker_) {
      worker_ = std::make_unique<CollectiveWorker>();
      worker_started_.store(worker_.get(), std::memory_order_release);
    }
    worker_->submit(request, bytes, dumping_on_error(std::move(job)));
  }
  return Request(std::move(request));
}

void CommunicatorImpl::dump_after(const Error& error) {
  if (error.kind() == ErrorKind::usage) return;
  DumpService::instance().write_after_error(
      error.operation().empty() ? to_string(error.kind()) : error.operation() + " failed");
}

nlohmann::ordered_json CommunicatorImpl::state() const {
  const p2p::Messenger& m = *messenger_;
  auto peers = nlohmann::ordered_json::array();
  for (int p = 0; p < m.size(); ++p) {
    nlohmann::ordered_json peer{{"rank", p}, {"transport", m.transport_name(p)}};
    if (const auto failure = m.peer_failure(p)) peer["failed"] = failure->what();
    peers.push_back(std::move(peer));
  }
  constexpr std::size_t shown = 256;
  const auto pending = m.pending(shown);
  auto requests = nlohmann::ordered_json::array();
  for (const auto& r : pending.requests) {
    nlohmann::ordered_json j{{"kind", r.kind}, {"bytes", r.bytes}, {"phase", r.phase}};
    j["peer"] =
        r.peer == any_source ? nlohmann::ordered_json("any") : nlohmann::ordered_json(r.peer);
    if (r.internal)
      j["collective_tag"] = r.tag - reserved_tags;
    else
      j["tag"] = r.tag == static_cast<std::uint64_t>(any_tag) ? nlohmann::ordered_json("any")
                                                              : nlohmann::ordered_json(r.tag);
    requests.push_back(std::move(j));
  }
  return {{"store_prefix", prefix_},
          {"rank", m.rank()},
          {"size", m.size()},
          {"host_id", m.host_id()},
          {"collectives", collectives_->recorder().to_json()},
          {"pending_p2p", std::move(requests)},
          {"pending_p2p_shown", shown},
          {"unexpected_messages", pending.unexpected_messages},
          {"unexpected_bytes", pending.unexpected_bytes},
          {"peers", std::move(peers)},
          {"hang_report", doctor_->last_report()}};
}

}  // namespace detail

Communicator::Communicator(std::shared_ptr<detail::CommunicatorImpl> impl)
    : impl_(std::move(impl)) {}

Communicator Communicator::create(int rank, int size, Store store, CommunicatorOptions options) {
  return Communicator(
      std::make_shared<detail::CommunicatorImpl>(rank, size, std::move(store), options));
}

namespace {

// The store key where rank 0 of a job whose root was found (not named) says which job it is.
constexpr const char* launch_job_key = "anview/launch/job";

// Runs `f`; an Error it raises also says how a root that no variable named was found.
template <typename F>
auto naming_the_root(const bootstrap::LaunchInfo& launch, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    if (launch.root_source.empty()) throw;
    ErrorContext context = e.context();
    context.cause += " (the bootstrap store at " + launch.root + ": " + launch.root_source + ")";
    throw Error(e.kind(), std::move(context));
  }
}

}  // namespace

Communicator Communicator::from_env(CommunicatorOptions options) {
  const auto launch = bootstrap::detect_launch();
  base::set_log_rank(launch.rank);
  StoreOptions store_options{.timeout = options.timeout, .rank = launch.rank};
  if (launch.rank != 0) {
    Store store =
        naming_the_root(launch, [&] { return Store::connect_tcp(launch.root, store_options); });
    // Another job may have found the same root (its ids gave the same port on a shared node):
    // leave its store before writing anything there.
    if (!launch.job.empty()) {
      const std::string theirs =
          naming_the_root(launch, [&] { return store.get_string(launch_job_key); });
      if (theirs != launch.job)
        throw Error(
            ErrorKind::usage,
            {.rank = launch.rank,
             .peer = 0,
             .peer_address = launch.root,
             .operation = "bootstrap.connect",
             .cause = "the bootstrap store at " + launch.root + " is " + theirs + "'s, not this " +
                      launch.job + "'s (" + launch.root_source +
                      "): two jobs found the same root; set another MASTER_PORT, or ANVIEW_ROOT"});
    }
    return create(launch.rank, launch.world_size, std::move(store), std::move(options));
  }
  if (!launch.root_source.empty())
    base::log("bootstrap", base::LogLevel::info, "serving the bootstrap store at ", launch.root,
              " (", launch.root_source, ")");
  const auto serve = bootstrap::store_serve_address(launch.root, launch.rank);
  if (!serve.why.empty()) base::log("bootstrap", base::LogLevel::info, serve.why);
  Store store =
      naming_the_root(launch, [&] { return Store::serve_tcp(serve.address, store_options); });
  if (!launch.job.empty()) naming_the_root(launch, [&] { store.set(launch_job_key, launch.job); });
  return create(launch.rank, launch.world_size, std::move(store), std::move(options));
}

int Communicator::rank() const {
  return impl_->messenger().rank();
}
int Communicator::size() const {
  return impl_->messenger().size();
}

Request Communicator::isend(const void* data, std::size_t bytes, int peer, Tag tag) {
  return Request(impl_->messenger().isend(data, bytes, peer, tag));
}

Request Communicator::irecv(void* data, std::size_t capacity, int source, Tag tag) {
  return Request(impl_->messenger().irecv(data, capacity, source, tag));
}

namespace {

Status wait_or_abandon(p2p::Messenger& messenger, const p2p::RequestPtr& impl,
                       std::optional<std::chrono::milliseconds> timeout) {
  try {
    return messenger.wait(*impl, timeout.value_or(messenger.default_timeout()));
  } catch (const Error& e) {
    // Completed between the deadline and giving up (another thread drove it): a message
    // received or sent is reported as such, not as a timeout the caller would retry.
    if (e.kind() == ErrorKind::timeout && !messenger.abandon(impl, e) && !impl->error)
      return impl->status;
    detail::CommunicatorImpl::dump_after(e);
    throw;
  }
}

}  // namespace

void Communicator::send(const void* data, std::size_t bytes, int peer, Tag tag,
                        std::optional<std::chrono::milliseconds> timeout) {
  if (impl_->messenger().send_now(data, bytes, peer, tag)) return;  // small, and the link had room
  auto impl = impl_->messenger().isend(data, bytes, peer, tag, p2p::Messenger::Poster::blocking);
  wait_or_abandon(impl_->messenger(), impl, timeout);
}

Status Communicator::recv(void* data, std::size_t capacity, int source, Tag tag,
                          std::optional<std::chrono::milliseconds> timeout) {
  auto impl =
      impl_->messenger().irecv(data, capacity, source, tag, p2p::Messenger::Poster::blocking);
  return wait_or_abandon(impl_->messenger(), impl, timeout);
}

std::string Communicator::dump_state() const {
  return impl_->state().dump(1);
}

void Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType type,
                             ReduceOp op) {
  impl_->run_collective("allreduce",
                        [&] { impl_->collectives().allreduce(send, recv, count, type, op); });
}

void Communicator::broadcast(void* data, std::size_t count, DataType type, int root) {
  impl_->run_collective("broadcast",
                        [&] { impl_->collectives().broadcast(data, count, type, root); });
}

void Communicator::reduce(const void* send, void* recv, std::size_t count, DataType type,
                          ReduceOp op, int root) {
  impl_->run_collective("reduce",
                        [&] { impl_->collectives().reduce(send, recv, count, type, op, root); });
}

void Communicator::allgather(const void* send, void* recv, std::size_t count, DataType type) {
  impl_->run_collective("allgather",
                        [&] { impl_->collectives().allgather(send, recv, count, type); });
}

void Communicator::reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                                  ReduceOp op) {
  impl_->run_collective("reduce_scatter",
                        [&] { impl_->collectives().reduce_scatter(send, recv, count, type, op); });
}

void Communicator::gather(const void* send, void* recv, std::size_t count, DataType type,
                          int root) {
  impl_->run_collective("gather",
                        [&] { impl_->collectives().gather(send, recv, count, type, root); });
}

void Communicator::scatter(const void* send, void* recv, std::size_t count, DataType type,
                           int root) {
  impl_->run_collective("scatter",
                        [&] { impl_->collectives().scatter(send, recv, count, type, root); });
}

void Communicator::alltoall(const void* send, void* recv, std::size_t count, DataType type) {
  impl_->run_collective("alltoall",
                        [&] { impl_->collectives().alltoall(send, recv, count, type); });
}

void Communicator::allgatherv(const void* send, std::size_t send_count, void* recv,
                              std::span<const std::size_t> recv_counts,
                              std::span<const std::size_t> displs, DataType type) {
  impl_->run_collective("allgatherv", [&] {
    impl_->collectives().allgatherv(send, send_count, recv, recv_counts, displs, type);
  });
}

void Communicator::gatherv(const void* send, std::size_t send_count, void* recv,
                           std::span<const std::size_t> recv_counts,
                           std::span<const std::size_t> displs, DataType type, int root) {
  impl_->run_collective("gatherv", [&] {
    impl_->collectives().gatherv(send, send_count, recv, recv_counts, displs, type, root);
  });
}

void Communicator::scatterv(const void* send, std::span<const std::size_t> send_counts,
                            std::span<const std::size_t> displs, void* recv, std::size_t recv_count,
                            DataType type, int root) {
  impl_->run_collective("scatterv", [&] {
    impl_->collectives().scatterv(send, send_counts, displs, recv, recv_count, type, root);
  });
}

void Communicator::alltoallv(const void* send, std::span<const std::size_t> send_counts,
                             std::span<const std::size_t> send_displs, void* recv,
                             std::span<const std::size_t> recv_counts,
                             std::span<const std::size_t> recv_displs, DataType type) {
  impl_->run_collective("alltoallv", [&] {
    impl_->collectives().alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs,
                                   type);
  });
}

void Communicator::barrier() {
  impl_->run_collective("barrier", [&] { impl_->collectives().barrier(); });
}

// Nonblocking collectives: the same calls on the communicator's collective thread. Buffers
// must stay valid until the Request completes; its status' bytes is the result's size here.
Request Communicator::iallreduce(const void* send, void* recv, std::size_t count, DataType type,
                                 ReduceOp op) {
  auto* c = &impl_->collectives();
  return impl_->start_collective("iallreduce", count * size_of(type),
                                 [=] { c->allreduce(send, recv, count, type, op); });
}

Request Communicator::ibroadcast(void* data, std::size_t count, DataType type, int root) {
  auto* c = &impl_->collectives();
  return impl_->start_collective("ibroadcast", count * size_of(type),
                                 [=] { c->broadcast(data, count, type, root); });
}

Request Communicator::ireduce(const void* send, void* recv, std::size_t count, DataType type,
                              ReduceOp op, int root) {
  auto* c = &impl_->collectives();
  return impl_->start_collective("ireduce", count * size_of(type),
                                 [=] { c->reduce(send, recv, count, type, op, root); });
}

Request Communicator::iallgather(const void* send, void* recv, std::size_t count, DataType type) {
  auto* c = &impl_->collectives();
  return impl_->start_collective("iallgather",
                                 count * size_of(type) * static_cast<std::size_t>(size()),
                                 [=] { c->allgather(send, recv, count, type); });
}

Request Communicator::ireduce_scatter(const void* send, void* recv, std::size_t count,
                                      DataType type, ReduceOp op) {
  auto* c = &impl_->collectives();
  return impl_->start_collective("ireduce_scatter", count * size_of(type),
                                 [=] { c->reduce_scatter(send, recv, count, type, op); });
}

Request Communicator::ialltoall(const void* send, void* recv, std::size_t count, DataType type) {
  auto* c = &impl_->collectives();
  return impl_->start_collective("ialltoall",
                                 count * size_of(type) * static_cast<std::size_t>(size()),
                                 [=] { c->alltoall(send, recv, count, type); });
}

Request Communicator::ibarrier() {
  auto* c = &impl_->collectives();
  return impl_->start_collective("ibarrier", 0, [=] { c->barrier(); });
}

namespace {

// What a nonblocking v-collective keeps of the caller's spans, which may end before it runs.
std::vector<std::size_t> copy_of(std::span<const std::size_t> s) {
  return {s.begin(), s.end()};
}

// The bytes of `counts` elements of `type` (a Request's status().bytes).
std::size_t bytes_of(std::span<const std::size_t> counts, DataType type) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0}) * size_of(type);
}

}  // namespace

Request Communicator::iallgatherv(const void* send, std::size_t send_count, void* recv,
                                  std::span<const std::size_t> recv_counts,
                                  std::span<const std::size_t> displs, DataType type) {
  auto* c = &impl_->collectives();
  return impl_->start_collective("iallgatherv", bytes_of(recv_counts, type),
                                 [=, counts = copy_of(recv_counts), at = copy_of(displs)] {
                                   c->allgatherv(send, send_count, recv, counts, at, type);
                                 });
}

Request Communicator::igatherv(const void* send, std::size_t send_count, void* recv,
                               std::span<const std::size_t> recv_counts,
                               std::span<const std::size_t> displs, DataType type, int root) {
  auto* c = &impl_->collectives();
  return impl_->start_collective("igatherv", rank() == root ? bytes_of(recv_counts, type) : 0,
                                 [=, counts = copy_of(recv_counts), at = copy_of(displs)] {
                                   c->gatherv(send, send_count, recv, counts, at, type, root);
                                 });
}

Request Communicator::iscatterv(const void* send, std::span<const std::size_t> send_counts,
                                std::span<const std::size_t> displs, void* recv,
                                std::size_t recv_count, DataType type, int root) {
  auto* c = &impl_->collectives();
  return impl_->start_collective("iscatterv", recv_count * size_of(type),
                                 [=, counts = copy_of(send_counts), at = copy_of(displs)] {
                                   c->scatterv(send, counts, at, recv, recv_count, type, root);
                                 });
}

Request Communicator::ialltoallv(const void* send, std::span<const std::size_t> send_counts,
                                 std::span<const std::size_t> send_displs, void* recv,
                                 std::span<const std::size_t> recv_counts,
                                 std::span<const std::size_t> recv_displs, DataType type) {
  auto* c = &impl_->collectives();
  return impl_->start_collective("ialltoallv", bytes_of(recv_counts, type),
                                 [=, scounts = copy_of(send_counts), sat = copy_of(send_displs),
                                  rcounts = copy_of(recv_counts), rat = copy_of(recv_displs)] {
                                   c->alltoallv(send, scounts, sat, recv, rcounts, rat, type);
                                 });
}

Communicator Communicator::split(int color, int key) const {
  if (color < 0) {
    throw Error(ErrorKind::usage, {.rank = rank(),
                                   .operation = "split",
                                   .cause = "color " + std::to_string(color) +
                                            " is negative; colors name groups and are >= 0"});
  }
  // Everyone learns everyone's (color, key); the ranks of one color, ordered by key and then
  // by their rank here, form the new communicator. It bootstraps through the same store under
  // its own prefix, so its connections, tags and sequence numbers are its own.
  const std::int64_t mine[2] = {color, key};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size()));
  impl_->run_collective(
      "split", [&] { impl_->collectives().allgather(mine, all.data(), 2, DataType::int64); });
  std::vector<std::pair<std::int64_t, int>> members;  // (key, old rank) of my color
  for (int r = 0; r < size(); ++r) {
    if (all[2 * static_cast<std::size_t>(r)] == color)
      members.emplace_back(all[2 * static_cast<std::size_t>(r) + 1], r);
  }
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  while (members[static_cast<std::size_t>(new_rank)].second != rank()) ++new_rank;
  const std::string prefix = impl_->store_prefix() + "/split" +
                             std::to_string(impl_->next_split()) + "/color" + std::to_string(color);
  Communicator sub =
      create(new_rank, static_cast<int>(members.size()), impl_->store(),
             {.timeout = impl_->messenger().default_timeout(),
              .store_prefix = prefix,
              .host_id = impl_->messenger().host_id()});  // the parent's, also when set
  base::set_log_rank(rank());  // log lines keep naming this process by its rank in the job
  return sub;
}

std::string Communicator::collective_algorithm(std::string_view collective, std::size_t bytes,
                                               std::string* why) const {
  return impl_->collectives().algorithm(collective, bytes, why);
}

std::string Communicator::explain_collective(std::string_view collective, std::size_t bytes) {
  std::string text;
  impl_->run_collective("explain", [&] { text = impl_->collectives().explain(collective, bytes); });
  return text;
}

void Communicator::progress() {
  impl_->messenger().progress();
}

std::string Communicator::transport_name(int peer) const {
  return impl_->messenger().transport_name(peer);
}

std::string Communicator::describe_peer(int peer) const {
  return impl_->messenger().describe_peer(peer);
}

std::string Communicator::transport_reason(int peer) const {
  return impl_->messenger().transport_reason(peer);
}

}  // namespace anview
