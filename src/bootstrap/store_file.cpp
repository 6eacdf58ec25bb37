// File store: one file per key in a directory every rank can see.
//
// Layout of the directory:
//   <escaped key>        the value, written whole to a temporary file and renamed into place,
//                        so a reader sees the old value or the new one, never a part
//   .tmp.<pid>.<n>.<r>   temporary files (a leading '.' never starts an escaped key)
//   .lock                flock()ed around every add (read, add, write back); threads of one
//                        process queue on a mutex first, then poll the flock (LOCK_NB, sleeps
//                        of 20 us growing to 1 ms) until their deadline
// Keys are escaped to file names: [A-Za-z0-9._-] stay (a leading '.' does not), everything
// else becomes %XX. An escaped name over 200 bytes is cut to 160 and followed by '~' and a
// 64-bit FNV-1a hash of the whole key ('~' never occurs in escaped names).
// get and wait poll with short sleeps (1 ms growing to 10 ms) until their deadline.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "anview/error.hpp"
#include "base/clock.hpp"
#include "base/socket.hpp"
#include "bootstrap/store_impl.hpp"
#include "bootstrap/store_protocol.hpp"

namespace anview::detail {
namespace {

namespace proto = bootstrap::store_protocol;

constexpr std::size_t max_plain_name = 200;
constexpr std::size_t cut_name = 160;
constexpr auto first_poll = std::chrono::microseconds(1000);
constexpr auto max_poll = std::chrono::microseconds(10000);

std::string escape_key(const std::string& key) {
  static const char hex[] = "0123456789ABCDEF";
  std::string name;
  name.reserve(key.size());
  for (std::size_t i = 0; i < key.size(); ++i) {
    const auto ch = static_cast<unsigned char>(key[i]);
    const bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                       (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || (ch == '.' && i > 0);
    if (plain) {
      name += static_cast<char>(ch);
    } else {
      name += '%';
      name += hex[ch >> 4];
      name += hex[ch & 15];
    }
  }
  if (name.size() <= max_plain_name) return name;
  std::uint64_t hash = 14695981039346656037ull;
  for (const char ch : key) {
    hash ^= static_cast<unsigned char>(ch);
    hash *= 1099511628211ull;
  }
  name.resize(cut_name);
  name += '~';
  for (int shift = 60; shift >= 0; shift -= 4) name += hex[(hash >> shift) & 15];
  return name;
}

// Sleeps before the next poll, never past the deadline. False when the deadline has passed.
bool poll_pause(base::Deadline deadline, std::chrono::microseconds& pause) {
  const auto now = base::Clock::now();
  if (now >= deadline) return false;
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
  std::this_thread::sleep_for(std::min(pause, left));
  pause = std::min(pause * 2, max_poll);
  return true;
}

class FileStore final : public StoreImpl {
 public:
  FileStore(const std::string& directory, const StoreOptions& options)
      : StoreImpl(options), dir_(directory) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec || !std::filesystem::is_directory(dir_, ec))
      fail(ErrorKind::usage, "store.open",
           "cannot create the store directory '" + dir_ +
               "': " + (ec ? ec.message() : std::string("not a directory")));
    std::random_device rd;
    salt_ = std::to_string(rd()) + std::to_string(rd());
  }

  void set(const std::string& key, const std::uint8_t* data, std::size_t size, Timeout) override {
    write_atomically("store.set", key, data, size);
  }

  Bytes get(const std::string& key, Timeout timeout) override {
    const auto deadline = base::deadline_after(timeout);
    auto pause = std::chrono::microseconds(first_poll);
    for (;;) {
      if (auto value = read_value("store.get", key)) return std::move(*value);
      if (!poll_pause(deadline, pause))
        fail(ErrorKind::timeout, "store.get",
             "key '" + key + "' was not set within " + std::to_string(timeout.count()) +
                 " ms (file store " + dir_ + ")");
    }
  }

  std::int64_t add(const std::string& key, std::int64_t delta, Timeout timeout) override {
    const auto deadline = base::deadline_after(timeout);
    // Threads of this process take turns (sleeping until woken), so only one of them at a time
    // polls the file lock against other processes: polling alone lets a thread starve.
    const LocalTurn turn(deadline);
    if (!turn.taken()) lock_timeout(key, timeout, "another thread's add");
    const base::Fd lock = take_lock(key, deadline, timeout);
    std::int64_t current = 0;
    if (auto value = read_value("store.add", key)) {
      if (!parse_counter(
              std::string_view(reinterpret_cast<const char*>(value->data()), value->size()),
              current))
        fail(ErrorKind::usage, "store.add", "the value of key '" + key + "' is not an integer");
    }
    std::int64_t result = 0;
    if (__builtin_add_overflow(current, delta, &result))
      fail(ErrorKind::usage, "store.add",
           "adding " + std::to_string(delta) + " to key '" + key + "' (" + std::to_string(current) +
               ") overflows int64");
    const std::string text = std::to_string(result);
    write_atomically("store.add", key, reinterpret_cast<const std::uint8_t*>(text.data()),
                     text.size());
    return result;
  }

  bool check(const std::vector<std::string>& keys, Timeout) override {
    return first_missing("store.check", keys) == nullptr;
  }

  void wait(const std::vector<std::string>& keys, Timeout timeout) override {
    const auto deadline = base::deadline_after(timeout);
    auto pause = std::chrono::microseconds(first_poll);
    std::size_t from = 0;  // keys before `from` were seen already; keys are never removed
    for (;;) {
      while (from < keys.size() && exists("store.wait", keys[from])) ++from;
      if (from == keys.size()) return;
      if (!poll_pause(deadline, pause)) {
        std::vector<std::string> absent;
        for (std::size_t i = from; i < keys.size(); ++i)
          if (!exists("store.wait", keys[i])) absent.push_back(keys[i]);
        if (absent.empty()) return;  // set while we looked
        fail(ErrorKind::timeout, "store.wait",
             (absent.size() == 1 ? "key " : "keys ") + describe_keys(absent) + " of " +
                 std::to_string(keys.size()) + " waited for " +
                 (absent.size() == 1 ? "was" : "were") + " not set within " +
                 std::to_string(timeout.count()) + " ms (file store " + dir_ + ")");
      }
    }
  }

  std::string address() const override { return dir_; }

 private:
  [[noreturn]] void fail(ErrorKind kind, const std::string& operation, std::string cause) const {
    throw Error(kind, {.rank = options().rank, .operation = operation, .cause = std::move(cause)});
  }
  [[noreturn]] void fail_sys(const std::string& operation, const std::string& what, int err) const {
    throw base::sys_error(ErrorKind::internal, {.rank = options().rank, .operation = operation},
                          what, err);
  }

  std::string path(const std::string& key) const { return dir_ + "/" + escape_key(key); }

  bool exists(const std::string& operation, const std::string& key) const {
    struct stat st {};
    if (::stat(path(key).c_str(), &st) == 0) return true;
    if (errno != ENOENT) fail_sys(operation, "stat(" + path(key) + ")", errno);
    return false;
  }

  const std::string* first_missing(const std::string& operation,
                                   const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (!exists(operation, k)) return &k;
    return nullptr;
  }

  std::optional<Bytes> read_value(const std::string& operation, const std::string& key) const {
    const std::string file = path(key);
    const base::Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT) return std::nullopt;
      fail_sys(operation, "open(" + file + ")", errno);
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) fail_sys(operation, "fstat(" + file + ")", errno);
    const std::uint32_t most = proto::Limits::configured().max_value_bytes;
    if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) > most)
      fail(ErrorKind::protocol, operation,
           "'" + file + "' holds " + std::to_string(st.st_size) +
               " bytes, more than a store value may (" + std::to_string(most) +
               ", ANVIEW_STORE_MAX_VALUE); the directory holds something else than a store");
    Bytes value(static_cast<std::size_t>(st.st_size));
    std::size_t done = 0;
    while (done < value.size()) {
      const ssize_t n = ::read(fd.get(), value.data() + done, value.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail_sys(operation, "read(" + file + ")", errno);
      if (n == 0) break;  // replaced files are never truncated in place; be lenient anyway
      done += static_cast<std::size_t>(n);
    }
    value.resize(done);
    return value;
  }

  void write_atomically(const std::string& operation, const std::string& key,
                        const std::uint8_t* data, std::size_t size) const {
    static std::atomic<std::uint64_t> counter{0};
    const std::string tmp = dir_ + "/.tmp." + std::to_string(::getpid()) + "." +
                            std::to_string(counter.fetch_add(1)) + "." + salt_;
    {
      const base::Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      if (!fd.valid()) fail_sys(operation, "open(" + tmp + ")", errno);
      std::size_t done = 0;
      while (done < size) {
        const ssize_t n = ::write(fd.get(), data + done, size - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          const int err = errno;
          ::unlink(tmp.c_str());
          fail_sys(operation, "write(" + tmp + ")", err);
        }
        done += static_cast<std::size_t>(n);
      }
    }
    const std::string file = path(key);
    if (::rename(tmp.c_str(), file.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      fail_sys(operation, "rename(" + tmp + ", " + file + ")", err);
    }
  }

  // Holds the directory's lock while the returned descriptor is open.
  base::Fd take_lock(const std::string& key, base::Deadline deadline, Timeout timeout) const {
    const std::string file = dir_ + "/.lock";
    base::Fd fd(::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd.valid()) fail_sys("store.add", "open(" + file + ")", errno);
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) return fd;
      if (errno != EWOULDBLOCK && errno != EINTR)
        fail_sys("store.add", "flock(" + file + ")", errno);
      const auto now = base::Clock::now();
      if (now >= deadline) lock_timeout(key, timeout, "'" + file + "'");
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
      std::this_thread::sleep_for(std::min(pause, left));
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  [[noreturn]] void lock_timeout(const std::string& key, Timeout timeout,
                                 const std::string& holder) const {
    fail(ErrorKind::timeout, "store.add",
         "could not lock " + dir_ + " within " + std::to_string(timeout.count()) +
             " ms to add to key '" + key + "' (waiting for " + holder + ")");
  }

  // One add at a time in this process (file stores of the same directory opened twice share
  // it). A mutex and condition variable rather than std::timed_mutex, whose clocklock
  // ThreadSanitizer does not understand.
  class LocalTurn {
   public:
    explicit LocalTurn(base::Deadline deadline) {
      std::unique_lock lock(mutex());
      taken_ = released().wait_until(lock, deadline, [] { return !busy(); });
      if (taken_) busy() = true;
    }
    ~LocalTurn() {
      if (!taken_) return;
      {
        const std::lock_guard lock(mutex());
        busy() = false;
      }
      released().notify_one();
    }
    LocalTurn(const LocalTurn&) = delete;
    LocalTurn& operator=(const LocalTurn&) = delete;
    bool taken() const { return taken_; }

   private:
    static std::mutex& mutex() {
      static std::mutex m;
      return m;
    }
    static std::condition_variable& released() {
      static std::condition_variable cv;
      return cv;
    }
    static bool& busy() {
      static bool b = false;
      return b;
    }
    bool taken_ = false;
  };

  std::string dir_;
  std::string salt_;
};

}  // namespace

std::shared_ptr<StoreImpl> open_file_store(const std::string& directory,
                                           const StoreOptions& options) {
  return std::make_shared<FileStore>(directory, options);
}

}  // namespace anview::detail
