// NumPy .npy and .npz files (npz: zip archives, stored or deflated entries).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace kiln {

Result<Tensor> parse_npy(const std::string& bytes, const std::string& what);
std::string serialize_npy(const Tensor& t);  // kString is written as fixed-width unicode ('<U')
Result<Tensor> read_npy(const std::string& path);
Status write_npy(const std::string& path, const Tensor& t);

// Entries in archive order; names without the ".npy" suffix.
Result<std::vector<std::pair<std::string, Tensor>>> read_npz(const std::string& path);
Status write_npz(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& entries);

}  // namespace kiln
