// Run deadlines: a time after which a run stops with a kDeadlineExceeded error
// (ExecutionContext::set_deadline, Interpreter::set_deadline, the CLI's --deadline).
//
// The deadline is this thread's, installed by a DeadlineScope around a run, rather than a member
// of one executor: every loop that runs nodes (the interpreter, the engine's layer loop, Loop and
// Scan iterations, any future body executor) checks it with one call and needs no plumbing.
// Runs happen on the calling thread (kernels may fan out to OpenMP workers, but nodes are
// scheduled here), so a thread-local holds exactly the run's deadline.
#pragma once

#include <chrono>
#include <optional>

#include "core/status.h"
#include "ir/graph.h"

namespace kiln::ops {

using DeadlineClock = std::chrono::steady_clock;
using Deadline = std::optional<DeadlineClock::time_point>;

// Installs `d` for the scope's lifetime (nests; the earlier of the enclosing and the new deadline
// applies); std::nullopt keeps the enclosing one.
class DeadlineScope {
 public:
  explicit DeadlineScope(Deadline d);
  ~DeadlineScope();
  DeadlineScope(const DeadlineScope&) = delete;
  DeadlineScope& operator=(const DeadlineScope&) = delete;

 private:
  Deadline saved_;
};

// This thread's deadline (nullopt: none).
Deadline current_deadline();

// Ok, or a kDeadlineExceeded error naming the node and `what` ("before this node", "after 1234
// iterations") when this thread's deadline has passed. Cheap when no deadline is set.
Status check_deadline(const ir::Node& node, const char* what = "before this node");
Status check_deadline(const ir::Node& node, int64_t iterations);

}  // namespace kiln::ops
