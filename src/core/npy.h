// NumPy .npy and .npz files (npz: zip archives, stored or deflated entries, zip64 sizes included).
// Reading checks every declared size before allocating (core/checked_size.h): an .npz member must
// declare exactly the bytes its .npy header needs before it is inflated, and is inflated in 1 MiB
// steps that cannot run past that size (a zip bomb is refused, never inflated).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace kiln {

Result<Tensor> parse_npy(std::string_view bytes, const std::string& what);
std::string serialize_npy(const Tensor& t);  // kString is written as fixed-width unicode ('<U')
Result<Tensor> read_npy(const std::string& path);
Status write_npy(const std::string& path, const Tensor& t);

// Entries in archive order; names without the ".npy" suffix.
Result<std::vector<std::pair<std::string, Tensor>>> read_npz(const std::string& path);
Status write_npz(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& entries);

}  // namespace kiln
