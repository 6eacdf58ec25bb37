// ANVIEW_TRACE's file: the ranks of a job add their events to one valid JSON document.
#include "base/trace.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace anview::base {
namespace {

std::string event(int pid, const std::string& name) {
  return "{\"name\":" + Trace::quoted(name) +
         ",\"ph\":\"X\",\"ts\":1,\"dur\":2,\"pid\":" + std::to_string(pid) + ",\"tid\":1}";
}

nlohmann::json read(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

struct TempFile {
  std::string path = "/tmp/anview-trace-test-" + std::to_string(::getpid()) + ".json";
  ~TempFile() { std::remove(path.c_str()); }
};

TEST(Trace, RanksOfOneJobAddToOneDocument) {
  TempFile f;
  Trace::merge_into(f.path, 42, event(0, "allreduce"));
  Trace::merge_into(f.path, 42, event(1, "allreduce") + ",\n" + event(1, "send"));
  const auto j = read(f.path);
  EXPECT_EQ(j["otherData"]["job_id"], "42");
  ASSERT_EQ(j["traceEvents"].size(), 3u);
  EXPECT_EQ(j["traceEvents"][0]["pid"], 0);
  EXPECT_EQ(j["traceEvents"][2]["name"], "send");
}

TEST(Trace, AnotherJobsFileIsReplaced) {
  TempFile f;
  Trace::merge_into(f.path, 1, event(0, "old"));
  Trace::merge_into(f.path, 2, event(0, "new"));
  const auto j = read(f.path);
  EXPECT_EQ(j["otherData"]["job_id"], "2");
  ASSERT_EQ(j["traceEvents"].size(), 1u);
  EXPECT_EQ(j["traceEvents"][0]["name"], "new");
}

TEST(Trace, AFileThatIsNoTraceIsReplaced) {
  TempFile f;
  { std::ofstream(f.path) << "not json at all"; }
  Trace::merge_into(f.path, 7, event(3, "barrier"));
  EXPECT_EQ(read(f.path)["traceEvents"][0]["pid"], 3);
}

TEST(Trace, NamesAreEscaped) {
  EXPECT_EQ(Trace::quoted("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\"");
  EXPECT_EQ(nlohmann::json::parse(Trace::quoted("say \"hi\"\t")), "say \"hi\"\t");
}

TEST(Trace, AnUnwritablePathIsAnError) {
  EXPECT_THROW(Trace::merge_into("/nonexistent-dir/trace.json", 1, event(0, "x")),
               std::runtime_error);
}

}  // namespace
}  // namespace anview::base
