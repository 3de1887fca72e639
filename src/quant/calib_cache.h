// The calibration cache (kiln build --calib-cache FILE): the activation ranges one calibration
// measured, so that a later build of the same model with the same calibrator needs no data.
//
//   {"format": "kiln-calibration-cache", "format_version": 1, "kiln_version": "0.1.0",
//    "model_hash": "crc32c:1a2b3c4d", "calibrator": "entropy", "percentile": 99.99,
//    "tensors": {"images": {"min": -0.81, "max": 2.02, "scale": 0.0111, "zero_point": 73}, ...}}
//
// min/max are what a build reads back (scale and zero point follow from them and are there to read).
// A cache of another format or kiln version (stale), of another model or calibrator (foreign), one
// that does not parse (corrupt), or one lacking a tensor the build quantizes is refused as a whole:
// load() says why, the builder warns and calibrates again when it has data (then overwrites the file).
#pragma once

#include <map>
#include <string>

#include "core/status.h"
#include "quant/calibrator.h"

namespace kiln::quant {

struct CalibrationKey {
  std::string model_hash;  // of the FP32 model as imported
  std::string calibrator;
  double percentile = 0;  // percentile only (0 otherwise)
  std::string kiln_version;
};

struct CalibrationCache {
  CalibrationKey key;
  std::map<std::string, Range> ranges;
};

// Reads PATH. Not found: kNotFound. Anything that makes it unusable for `want`: kInvalidArgument with
// the reason ("stale: written by kiln 0.0.9", "foreign: made for another model", "corrupt: ...").
Result<CalibrationCache> load_calibration_cache(const std::string& path, const CalibrationKey& want);
// Writes PATH (through PATH.tmp.<pid> and a rename: a reader never sees half a file).
Status save_calibration_cache(const std::string& path, const CalibrationCache& cache);

}  // namespace kiln::quant
