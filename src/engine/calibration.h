// INT8 post-training calibration inside kiln build (BuilderConfig::precision == kINT8): reads the
// calibration batches, runs them through an FP32 engine of the model (fast tactics, not the reference
// interpreter) observing the activations that quantized layers will read, turns their statistics into
// ranges (quant/calibrator.h) or takes them from the calibration cache, and rewrites the model with
// Q/DQ nodes (quant/qdq_insert.h). The Q/DQ model then builds like any other: the pass folding Q/DQ
// patterns into INT8 layers sees explicit and calibrated INT8 alike.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"
#include "kiln/kiln.h"
#include "ops/value.h"

namespace kiln::detail {

// The calibration batches of `path` (calib_data's forms), each a map input name -> tensor, at most
// `max_batches` (0: all). Errors name the file and what is wrong.
Result<std::vector<std::map<std::string, ops::Value>>> read_calibration_batches(const ir::Graph& g,
                                                                                const std::string& path,
                                                                                int max_batches, int batch_size);

// The INT8 step of the build: rewrites model.graph (Q/DQ) and returns the build record's "int8" entry
// (calibrator, batches, per tensor its range, scale and zero point). A model that has Q/DQ nodes
// already is left as it is ({"mode": "explicit"}).
Result<nlohmann::json> quantize_for_int8(ir::Model& model, const BuilderConfig& cfg,
                                         const std::function<void(const std::string&)>& log,
                                         const std::function<void(const std::string&)>& warn);

}  // namespace kiln::detail
