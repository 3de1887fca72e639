// The variant list: every CPU tactic, per op, in priority order. It drives the builder's choice
// (first supporting tactic until the auto-tuner times them), the tactic unit tests (each listed
// tactic is checked against the reference kernel) and, later, the benchmarks. A new kernel is one
// line here.
#include <algorithm>

#include "backends/tactic.h"

#include "backends/cpu/kiln_tactics.h"
#if defined(KILN_HAVE_ONEDNN)
#include "backends/cpu/onednn_tactics.h"
#endif

namespace kiln::backends {

std::string device_name(const Device& d) {
  return d.kind == DeviceKind::kCPU ? "cpu" : "cuda:" + std::to_string(d.index);
}

const std::vector<const Tactic*>& all_tactics() {
  static const std::vector<const Tactic*> list = [] {
    std::vector<const Tactic*> v;
#if defined(KILN_HAVE_ONEDNN)
    namespace dnn = cpu::onednn;
    // Conv / kiln.FusedConv
    v.push_back(dnn::conv2d_onednn_blocked());
    v.push_back(dnn::conv2d_onednn_nchw());
    // MatMul / Gemm / kiln.FusedMatMul / kiln.FusedGemm
    v.push_back(dnn::matmul_onednn_packed());
    v.push_back(dnn::matmul_onednn_batched());
    // MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool
    v.push_back(dnn::pool2d_onednn_nchw());
#endif
    // kiln's own kernels (after oneDNN's until the auto-tuner times them)
    v.push_back(cpu::gemm_kiln_packed());
    v.push_back(cpu::conv2d_kiln_1x1());
    v.push_back(cpu::conv2d_kiln_depthwise());
    v.push_back(cpu::pool2d_kiln_nchw());
    return v;
  }();
  return list;
}

const Tactic* find_tactic(const std::string& name) {
  for (const Tactic* t : all_tactics())
    if (t->name() == name) return t;
  return nullptr;
}

std::vector<const Tactic*> candidate_tactics(const LayerSignature& sig) {
  std::vector<const Tactic*> out;
  for (const Tactic* t : all_tactics()) {
    auto ops = t->ops();
    bool implements = std::find(ops.begin(), ops.end(), std::make_pair(sig.domain(), sig.op())) != ops.end();
    if (implements && t->device() == sig.device && t->supports(sig)) out.push_back(t);
  }
  return out;
}

}  // namespace kiln::backends
