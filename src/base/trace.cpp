#include "base/trace.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "base/config.hpp"
#include "base/log.hpp"

namespace anview::base {
namespace {

const Setting trace_setting("base", "ANVIEW_TRACE", "",
                            "Write a Chrome trace-event JSON file (Perfetto) of the operations "
                            "here, one track per rank (empty: off)");
const Setting detail_setting("base", "ANVIEW_TRACE_DETAIL", "ops",
                             "What ANVIEW_TRACE records: ops (collectives) or transfers (also "
                             "every point-to-point send and receive)");
const Setting events_setting("base", "ANVIEW_TRACE_EVENTS", "1000000",
                             "Most trace events a process keeps; later ones are counted as "
                             "dropped");

double wall_now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string header(std::uint64_t job_id) {
  return "{\"otherData\":{\"job_id\":\"" + std::to_string(job_id) + "\"},\"traceEvents\":[\n";
}
constexpr std::string_view footer = "\n]}\n";

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

void write_all(int fd, const std::string& text, off_t at) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n =
        ::pwrite(fd, text.data() + done, text.size() - done, at + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(errno_text("pwrite"));
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

Trace* Trace::active() {
  static Trace* trace = []() -> Trace* {
    const std::string path = trace_setting.value();
    if (path.empty()) return nullptr;
    const std::string detail = detail_setting.value();
    if (detail != "ops" && detail != "transfers") {
      log("base", LogLevel::warn, "ANVIEW_TRACE_DETAIL='", detail,
          "' is not ops or transfers; using ops");
    }
    // Never destroyed: communicators may close during static destruction.
    return new Trace(path, detail == "transfers",
                     static_cast<std::size_t>(std::max<std::int64_t>(events_setting.as_int(), 0)));
  }();
  return trace;
}

Trace::Trace(std::string path, bool transfers, std::size_t limit)
    : path_(std::move(path)),
      transfers_(transfers),
      limit_(limit),
      steady_origin_(Clock::now()),
      wall_origin_us_(wall_now_us()) {}

void Trace::open(std::uint64_t job_id, int rank) {
  std::lock_guard lock(mu_);
  if (open_++ == 0 && events_.empty()) {
    job_id_ = job_id;
    rank_ = rank;
  }
}

void Trace::close() {
  std::lock_guard lock(mu_);
  if (--open_ == 0) flush();
}

void Trace::add(Track track, std::string_view name, Clock::time_point start, Clock::time_point end,
                std::string_view args) {
  const auto us = [&](Clock::time_point t) {
    return wall_origin_us_ + std::chrono::duration<double, std::micro>(t - steady_origin_).count();
  };
  char times[96];
  std::snprintf(times, sizeof times, "\"ts\":%.3f,\"dur\":%.3f", us(start),
                std::chrono::duration<double, std::micro>(end - start).count());
  std::lock_guard lock(mu_);
  if (events_.size() >= limit_) {
    ++dropped_;
    return;
  }
  std::string e = "{\"name\":" + quoted(name) + ",\"ph\":\"X\"," + times +
                  ",\"pid\":" + std::to_string(rank_) +
                  ",\"tid\":" + std::to_string(static_cast<int>(track));
  if (!args.empty()) {
    e += ",\"args\":{";
    e += args;
    e += '}';
  }
  e += '}';
  events_.push_back(std::move(e));
}

std::string Trace::quoted(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void Trace::flush() {
  if (events_.empty() && dropped_ == 0) return;
  // The rank's track: its name, its threads' names, sorted by rank.
  const std::string pid = std::to_string(rank_);
  std::string text = "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid +
                     ",\"args\":{\"name\":\"rank " + pid + "\"}},\n" +
                     "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + pid +
                     ",\"args\":{\"sort_index\":" + pid + "}},\n" +
                     "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + pid +
                     ",\"tid\":1,\"args\":{\"name\":\"collectives\"}},\n" +
                     "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + pid +
                     ",\"tid\":2,\"args\":{\"name\":\"p2p\"}}";
  if (dropped_ > 0) {
    text += ",\n{\"name\":\"dropped events\",\"ph\":\"i\",\"s\":\"p\",\"ts\":" +
            std::to_string(static_cast<long long>(wall_now_us())) + ",\"pid\":" + pid +
            ",\"tid\":1,\"args\":{\"dropped\":" + std::to_string(dropped_) +
            ",\"limit\":\"ANVIEW_TRACE_EVENTS\"}}";
  }
  for (const auto& e : events_) {
    text += ",\n";
    text += e;
  }
  try {
    merge_into(path_, job_id_, text);
    log("base", LogLevel::info, "trace: ", events_.size(), " events of rank ", rank_,
        " written to ", path_);
  } catch (const std::exception& e) {
    log("base", LogLevel::warn, "trace: cannot write ", path_, ": ", e.what(),
        " (ANVIEW_TRACE names the file)");
  }
  events_.clear();
  dropped_ = 0;
}

void Trace::merge_into(const std::string& path, std::uint64_t job_id, const std::string& events) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(errno_text("open"));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }  // also drops the lock
  } closer{fd};
  // Another rank may hold the lock while it writes: wait for it, but not for ever.
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) throw std::runtime_error(errno_text("flock"));
    if (Clock::now() > deadline)
      throw std::runtime_error("another process holds its lock for 30 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw std::runtime_error(errno_text("fstat"));
  const std::string head = header(job_id);
  const auto size = static_cast<std::size_t>(st.st_size);
  std::string start(std::min(size, head.size()), '\0'), end(std::min(size, footer.size()), '\0');
  bool ours = size >= head.size() + footer.size() &&
              ::pread(fd, start.data(), start.size(), 0) == static_cast<ssize_t>(start.size()) &&
              ::pread(fd, end.data(), end.size(), static_cast<off_t>(size - end.size())) ==
                  static_cast<ssize_t>(end.size()) &&
              start == head && end == footer;
  if (ours) {
    write_all(fd, ",\n" + events + std::string(footer), static_cast<off_t>(size - footer.size()));
  } else {
    if (::ftruncate(fd, 0) != 0) throw std::runtime_error(errno_text("ftruncate"));
    write_all(fd, head + events + std::string(footer), 0);
  }
}

}  // namespace anview::base
