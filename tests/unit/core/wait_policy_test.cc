// kiln bench's contention measurement (core/wait_policy.h): the run-queue delay of the process's threads.
#include "core/wait_policy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

namespace kiln {
namespace {

TEST(WaitPolicy, DescribesTheEnvironmentsChoice) {
  const char* saved = std::getenv("OMP_WAIT_POLICY");
  std::string keep = saved ? saved : "";
  setenv("OMP_WAIT_POLICY", "passive", 1);
  EXPECT_NE(wait_policy_description().find("OMP_WAIT_POLICY=passive"), std::string::npos);
  if (saved)
    setenv("OMP_WAIT_POLICY", keep.c_str(), 1);
  else
    unsetenv("OMP_WAIT_POLICY");
}

TEST(WaitPolicy, ThreadsThatOutnumberTheCoresWaitOnTheRunQueue) {
  if (!std::filesystem::exists("/proc/self/task/" + std::to_string(getpid()) + "/schedstat"))
    GTEST_SKIP() << "the kernel keeps no schedstat (CONFIG_SCHED_INFO off)";
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const double before = runqueue_wait_s();
  EXPECT_GE(before, 0);
  // Three busy threads per core for 0.3 s: each is runnable all the time and gets at most a third of a
  // core, so together they wait about 2 x 0.3 s per core on the run queue (at least 0.05 s asserted).
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (unsigned i = 0; i < 3 * cores; ++i)
    busy.emplace_back([&stop] {
      volatile unsigned long x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double during = runqueue_wait_s();  // the busy threads are alive: their delay is counted
  stop = true;
  for (auto& t : busy) t.join();
  EXPECT_GT(during - before, 0.05) << "run-queue wait did not grow with " << 3 * cores << " busy threads on " << cores
                                   << " cores";
}

}  // namespace
}  // namespace kiln
