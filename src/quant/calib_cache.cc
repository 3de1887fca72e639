// The calibration cache file (calib_cache.h).
#include "quant/calib_cache.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/bounded_json.h"

namespace kiln::quant {

namespace {
constexpr const char* kFormat = "kiln-calibration-cache";
constexpr int kFormatVersion = 1;
}  // namespace

Result<CalibrationCache> load_calibration_cache(const std::string& path, const CalibrationKey& want) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound("calibration cache '", path, "' does not exist");
  std::stringstream ss;
  ss << f.rdbuf();
  auto parsed = parse_bounded_json(ss.str(), "calibration cache '" + path + "'", ErrorCode::kInvalidArgument);
  if (!parsed.ok()) return InvalidArgument("corrupt: ", parsed.status().message());
  const nlohmann::json& j = parsed.value();
  CalibrationCache c;
  try {
    if (!j.is_object() || j.value("format", std::string()) != kFormat)
      return InvalidArgument("corrupt: not a kiln calibration cache (no \"format\": \"", kFormat, "\")");
    int version = j.at("format_version").get<int>();
    c.key.kiln_version = j.at("kiln_version").get<std::string>();
    if (version != kFormatVersion)
      return InvalidArgument("stale: cache format ", version, ", this kiln reads format ", kFormatVersion);
    if (c.key.kiln_version != want.kiln_version)
      return InvalidArgument("stale: written by kiln ", c.key.kiln_version, ", this is kiln ", want.kiln_version);
    c.key.model_hash = j.at("model_hash").get<std::string>();
    c.key.calibrator = j.at("calibrator").get<std::string>();
    c.key.percentile = j.value("percentile", 0.0);
    if (c.key.model_hash != want.model_hash)
      return InvalidArgument("foreign: made for another model (", c.key.model_hash, ", this model is ", want.model_hash,
                             ")");
    if (c.key.calibrator != want.calibrator || c.key.percentile != want.percentile)
      return InvalidArgument("foreign: made with calibrator ", c.key.calibrator,
                             c.key.calibrator == "percentile" ? " " + std::to_string(c.key.percentile) : "",
                             ", this build asks for ", want.calibrator,
                             want.calibrator == "percentile" ? " " + std::to_string(want.percentile) : "");
    for (const auto& [name, t] : j.at("tensors").items()) {
      Range r{t.at("min").get<double>(), t.at("max").get<double>()};
      if (!(r.min <= r.max)) return InvalidArgument("corrupt: tensor '", name, "' has min ", r.min, " > max ", r.max);
      c.ranges[name] = r;
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("corrupt: ", e.what());
  }
  return c;
}

Status save_calibration_cache(const std::string& path, const CalibrationCache& cache) {
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [name, r] : cache.ranges) {
    QuantParams p = uint8_params(r);
    tensors[name] = {{"min", r.min}, {"max", r.max}, {"scale", p.scale}, {"zero_point", p.zero_point}};
  }
  nlohmann::json j = {{"format", kFormat},
                      {"format_version", kFormatVersion},
                      {"kiln_version", cache.key.kiln_version},
                      {"model_hash", cache.key.model_hash},
                      {"calibrator", cache.key.calibrator},
                      {"percentile", cache.key.percentile},
                      {"tensors", tensors}};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return IOError("cannot write calibration cache '", tmp, "'");
    f << j.dump(1) << "\n";
    if (!f.flush()) return IOError("cannot write calibration cache '", tmp, "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return IOError("cannot rename '", tmp, "' to calibration cache '", path, "'");
  }
  return Status::Ok();
}

}  // namespace kiln::quant
