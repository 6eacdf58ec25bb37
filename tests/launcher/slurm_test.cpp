// Ranks started the way srun starts them: with Slurm's variables only (no anview-run, no
// MASTER_ADDR, no ANVIEW_ROOT). They must find rank 0's store on the first node of the step by
// themselves and run a job (anview-perf, ANVIEW_PERF_PATH); a rank of another job that finds
// the same store must leave it alone.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "job_test.hpp"

namespace anview::testing {
namespace {

constexpr int step = 3;

// A Slurm job id whose port (20000 + (id % 1000) * 10 + step) is free on 127.0.0.1 now.
int job_with_a_free_port() {
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int job = 1000 + static_cast<int>((::getpid() + attempt * 7919) % 1000);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_port = htons(static_cast<std::uint16_t>(20000 + job % 1000 * 10 + step));
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool free = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0;
    if (fd >= 0) ::close(fd);
    if (free) return job;
  }
  return -1;
}

class Slurm : public JobTest {
 protected:
  // Task `procid` of 2 of Slurm job `job` running anview-perf, its output into `out`, as a
  // command line for sh; srun's variables only (none of the test runner's launch variables).
  std::string task(int job, int procid, const fs::path& out) const {
    return "env -u ANVIEW_RANK -u ANVIEW_WORLD_SIZE -u ANVIEW_ROOT -u RANK -u MASTER_ADDR "
           "-u MASTER_PORT -u OMPI_COMM_WORLD_RANK -u ANVIEW_SECRET_FILE "
           "-u TORCHELASTIC_USE_AGENT_STORE ANVIEW_SECRET=slurm-test ANVIEW_TRANSPORTS=tcp "
           "ANVIEW_TIMEOUT=20 ANVIEW_LOG_LEVEL=info SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 "
           "SLURM_JOB_ID=" +
           std::to_string(job) + " SLURM_STEP_ID=" + std::to_string(step) +
           " SLURM_STEP_NODELIST=\"localhost,node[2-3]\" SLURMD_NODENAME=localhost SLURM_PROCID=" +
           std::to_string(procid) + " SLURM_LOCALID=" + std::to_string(procid) + " \"" +
           ANVIEW_PERF_PATH + "\" pingpong -b 8 -e 64 -f 8 -n 10 -w 1 --check >\"" + out.string() +
           "\" 2>&1";
  }

  static bool ran(const std::string& script) {
    const std::string command = "timeout 60 sh -c '" + script + "' </dev/null";
    const int status = std::system(command.c_str());
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
};

TEST_F(Slurm, TasksFindRankZerosNodeWithNothingButSrunsVariables) {
  const int job = job_with_a_free_port();
  ASSERT_GT(job, 0) << "no free port in 20000..29999";
  const std::string port = std::to_string(20000 + job % 1000 * 10 + step);
  const fs::path out0 = dir_ / "rank0", out1 = dir_ / "rank1";
  const bool ok =
      ran(task(job, 1, out1) + " & " + task(job, 0, out0) + "; a=$?; wait $!; exit $((a | $?))");
  const std::string rank0 = read(out0), rank1 = read(out1);
  ASSERT_TRUE(ok) << rank0 << rank1;
  EXPECT_NE(rank0.find("serving the bootstrap store at localhost:" + port +
                       " (the first node of SLURM_STEP_NODELIST"),
            std::string::npos)
      << rank0;
  EXPECT_NE(rank0.find("64 B"), std::string::npos) << rank0;  // the last size ran
  EXPECT_NE(rank1.find("rank 0 via tcp"), std::string::npos) << rank1;
}

// Job ids 1000 apart give the same port: a task of the other job that reaches this job's store
// (their first node shared) leaves at once, naming both jobs, and this job runs on undisturbed.
TEST_F(Slurm, ATaskOfAnotherJobOnTheSameStoreLeavesItAlone) {
  const int job = job_with_a_free_port();
  ASSERT_GT(job, 0) << "no free port in 20000..29999";
  const int other = job + 1000;
  const fs::path a0 = dir_ / "a0", a1 = dir_ / "a1", b1 = dir_ / "b1", b_rc = dir_ / "b_rc";
  const bool ok =
      ran(task(job, 0, a0) + " & a0=$!; " + task(other, 1, b1) + "; echo $? >\"" + b_rc.string() +
          "\"; " + task(job, 1, a1) + "; a1=$?; wait $a0; exit $((a1 | $?))");
  const std::string first = read(a0), second = read(a1), intruder = read(b1);
  EXPECT_TRUE(ok) << "job " << job << " failed:\n" << first << second;
  EXPECT_EQ(read(b_rc), "1\n") << intruder;
  EXPECT_NE(intruder.find("is slurm job " + std::to_string(job) + " step 3's, not this slurm job " +
                          std::to_string(other) + " step 3's"),
            std::string::npos)
      << intruder;
  EXPECT_NE(first.find("64 B"), std::string::npos) << first;  // rank 0 prints the table
}

}  // namespace
}  // namespace anview::testing
