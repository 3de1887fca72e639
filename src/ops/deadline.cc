#include "ops/deadline.h"

namespace kiln::ops {

namespace {
thread_local Deadline t_deadline;

Status exceeded(const ir::Node& node, const std::string& what) {
  return DeadlineExceeded(node.where(), "the run passed its deadline (", what,
                          "); give it more time (--deadline SECONDS, ExecutionContext::set_deadline) or "
                          "check the model for a loop that runs longer than intended");
}
}  // namespace

DeadlineScope::DeadlineScope(Deadline d) : saved_(t_deadline) {
  if (d && (!t_deadline || *d < *t_deadline)) t_deadline = d;
}

DeadlineScope::~DeadlineScope() { t_deadline = saved_; }

Deadline current_deadline() { return t_deadline; }

Status check_deadline(const ir::Node& node, const char* what) {
  if (!t_deadline || DeadlineClock::now() <= *t_deadline) return Status::Ok();
  return exceeded(node, what);
}

Status check_deadline(const ir::Node& node, int64_t iterations) {
  if (!t_deadline || DeadlineClock::now() <= *t_deadline) return Status::Ok();
  return exceeded(node, "stopped after " + std::to_string(iterations) + " iterations");
}

}  // namespace kiln::ops
