// Two ranks started the way srun starts them: with Slurm's variables only (no anview-run, no
// MASTER_ADDR, no ANVIEW_ROOT). They must find rank 0's store on the first node of the step by
// themselves and run a job (anview-perf, ANVIEW_PERF_PATH).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "job_test.hpp"

namespace anview::testing {
namespace {

class Slurm : public JobTest {};

TEST_F(Slurm, TasksFindRankZerosNodeWithNothingButSrunsVariables) {
  // A job id of its own per test process: the port it gives is 20000 + (id % 1000) * 10 + step.
  const int job = 5000 + static_cast<int>(::getpid() % 1000);
  const std::string port = std::to_string(20000 + job % 1000 * 10 + 3);
  const std::string task =
      std::string("\"") + ANVIEW_PERF_PATH + "\" pingpong -b 8 -e 64 -f 8 -n 10 -w 1 --check";
  const fs::path out0 = dir_ / "rank0", out1 = dir_ / "rank1";
  const std::string command =
      "timeout 60 env -u ANVIEW_RANK -u ANVIEW_WORLD_SIZE -u ANVIEW_ROOT -u RANK -u MASTER_ADDR "
      "-u MASTER_PORT -u OMPI_COMM_WORLD_RANK -u ANVIEW_SECRET_FILE ANVIEW_SECRET=slurm-test "
      "ANVIEW_TRANSPORTS=tcp ANVIEW_TIMEOUT=20 ANVIEW_LOG_LEVEL=info SLURM_NTASKS=2 "
      "SLURM_JOB_ID=" +
      std::to_string(job) +
      " SLURM_STEP_ID=3 SLURM_STEP_NODELIST='localhost,node[2-3]' SLURMD_NODENAME=localhost sh "
      "-c 'SLURM_PROCID=1 SLURM_LOCALID=1 " +
      task + " >\"" + out1.string() + "\" 2>&1 & SLURM_PROCID=0 SLURM_LOCALID=0 " + task + " >\"" +
      out0.string() + "\" 2>&1; a=$?; wait $!; exit $((a | $?))' </dev/null";
  const int status = std::system(command.c_str());
  const std::string rank0 = read(out0), rank1 = read(out1);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << rank0 << rank1;
  EXPECT_NE(rank0.find("serving the bootstrap store at localhost:" + port +
                       " (the first node of SLURM_STEP_NODELIST"),
            std::string::npos)
      << rank0;
  EXPECT_NE(rank0.find("64 B"), std::string::npos) << rank0;  // the last size ran
  EXPECT_NE(rank1.find("rank 0 via tcp"), std::string::npos) << rank1;
}

}  // namespace
}  // namespace anview::testing
