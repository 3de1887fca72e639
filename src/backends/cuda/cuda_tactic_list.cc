#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_tactics.h"
#include "backends/cuda/cudnn_tactics.h"

namespace kiln::backends::cuda {

const std::vector<const Tactic*>& tactic_list() {
  static const std::vector<const Tactic*> list = [] {
    std::vector<const Tactic*> v = matmul_tactics();
    for (const Tactic* t : own_kernel_tactics()) v.push_back(t);
    for (const Tactic* t : cudnn_conv_tactics()) v.push_back(t);
    for (const Tactic* t : cnn_kernel_tactics()) v.push_back(t);
    for (const Tactic* t : int8_tactics()) v.push_back(t);
    for (const Tactic* t : more_kernel_tactics()) v.push_back(t);
    for (const Tactic* t : flash_attention_tactics()) v.push_back(t);
    for (const Tactic* t : attention_tactics()) v.push_back(t);
    return v;
  }();
  return list;
}

std::string library_versions() {
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  return "CUDA runtime " + std::to_string(rt / 1000) + "." + std::to_string(rt % 1000 / 10) + " + " +
         cublaslt_version() + " + " + cudnn_version();
}

}  // namespace kiln::backends::cuda
