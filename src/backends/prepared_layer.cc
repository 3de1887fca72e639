#include <cstring>
#include <memory>
#include <new>

#include "backends/tactic.h"
#include "core/parallel.h"

namespace kiln::backends {

void poison_workspace(void* p, size_t bytes) {
  if (p && bytes) std::memset(p, 0xFF, bytes);
}

Status PreparedLayer::run_standalone(const std::vector<const Tensor*>& inputs,
                                     const std::vector<Tensor*>& outputs) const {
  RunContext ctx;
  ctx.threads = kiln::max_threads();
  ctx.workspace_bytes = workspace_bytes(ctx.threads);
  std::unique_ptr<uint8_t, void (*)(uint8_t*)> ws(nullptr,
                                                  [](uint8_t* q) { ::operator delete[](q, std::align_val_t(64)); });
  if (ctx.workspace_bytes) {
    ws.reset(static_cast<uint8_t*>(::operator new[](ctx.workspace_bytes, std::align_val_t(64))));
    poison_workspace(ws.get(), ctx.workspace_bytes);
    ctx.workspace = ws.get();
  }
  return run(ctx, inputs, outputs);
}

}  // namespace kiln::backends
