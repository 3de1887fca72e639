#include "tools/cli_common.h"

#include "engine/engine_impl.h"

#include "tools/commands.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <new>
#include <random>

#include "core/checked_size.h"
#include "core/npy.h"
#include "onnx/importer.h"

#include <algorithm>
#include <cstring>

namespace kiln::tools {

int exit_code_for(const Status& s) {
  switch (s.code()) {
    case ErrorCode::kOk: return kExitOk;
    case ErrorCode::kUnsupported: return kExitUnsupported;
    case ErrorCode::kInternal: return kExitInternal;
    case ErrorCode::kDeadlineExceeded: return kExitDeadline;
    default: return kExitInvalidInput;
  }
}

Status detail_status(const Error& e) { return detail::status_of(e); }

CLI::Validator bounded(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        char* end = nullptr;
        double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !std::isfinite(v)) return "'" + text + "' is not a finite number";
        if (v < lo || v > hi) return "value " + text + " is out of range: " + str_cat(lo) + " to " + str_cat(hi);
        return std::string();
      },
      "in [" + str_cat(lo) + ", " + str_cat(hi) + "]");
}

void add_deadline_option(CLI::App* cmd, double& seconds) {
  cmd->add_option("--deadline", seconds,
                  "stop each run with a 'deadline exceeded' error (exit 6) once it has run SECONDS (checked between "
                  "layers and Loop/Scan iterations)")
      ->check(bounded(0, kMaxSeconds));
}

std::optional<std::chrono::steady_clock::time_point> deadline_after(double seconds) {
  if (!(seconds > 0)) return std::nullopt;
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

Result<int64_t> checked_numel(const Dims& d, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(int64_t n, kiln::checked_numel(d, what));
  int64_t bytes = 0;
  if (!checked_mul(n, int64_t{16}, &bytes))
    return InvalidArgument(what, ": shape ", dims_str(d), " has ", n, " elements, more than a 64-bit byte size holds");
  return n;
}

int report_error(const Status& s) {
  std::fprintf(stderr, "kiln: error: %s\n", s.to_string().c_str());
  return exit_code_for(s);
}

Result<ops::Value> read_value_file(const std::string& path, const ir::TypeInfo* expected) {
  auto ends_with = [&](const char* suf) {
    size_t n = std::strlen(suf);
    return path.size() >= n && path.compare(path.size() - n, n, suf) == 0;
  };
  // A reader that throws (an allocation a hostile header asks for) still names the file.
  return detail::guarded("reading '" + path + "'", [&]() -> Result<ops::Value> {
    if (ends_with(".npy")) {
      KILN_ASSIGN_OR_RETURN(Tensor t, read_npy(path));
      return ops::Value(std::move(t));
    }
    return onnx_import::read_value_pb(path, expected);
  });
}

Status fill_random_inputs(const ir::Graph& g, uint64_t seed, const std::map<std::string, Dims>& shapes,
                          std::map<std::string, ops::Value>& inputs) {
  std::mt19937_64 rng(seed);
  for (const auto& in : g.inputs) {
    if (inputs.count(in.name) || g.initializers.count(in.name)) continue;
    if (!in.type.is_tensor())
      return InvalidArgument("input '", in.name, "' is a ", in.type.str(),
                             "; give it with --input, random values are only made for tensors");
    Dims d;
    auto it = shapes.find(in.name);
    if (it != shapes.end()) {
      d = it->second;
    } else if (!in.type.shape.rank_known) {
      return InvalidArgument("input '", in.name, "' has unknown rank; give its shape with --shapes ", in.name,
                             ":1x3x224x224");
    } else {
      for (const auto& dim : in.type.shape.dims) d.push_back(dim.known() ? dim.value : 1);
    }
    KILN_ASSIGN_OR_RETURN(int64_t numel, checked_numel(d, "random input '" + in.name + "'"));
    // Random inputs larger than half the machine's memory only end in the OOM killer (the run needs
    // its outputs and activations too): refuse them with the sizes.
    const double bytes =
        static_cast<double>(numel) * static_cast<double>(std::max<size_t>(dtype_size(in.type.elem), 1));
    const double phys = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    if (phys > 0 && bytes > phys / 2)
      return OutOfRange("random input '", in.name, "' of shape ", dims_str(d), " needs ",
                        static_cast<int64_t>(bytes / (1 << 20)), " MiB, more than half of this machine's memory (",
                        static_cast<int64_t>(phys / (1 << 20)), " MiB); give smaller --shapes / --batch");
    Tensor t;
    try {
      t = Tensor(in.type.elem, d);
    } catch (const std::bad_alloc&) {
      return OutOfRange("random input '", in.name, "' of shape ", dims_str(d), " (", dims_numel(d), " elements of ",
                        dtype_name(in.type.elem), ") does not fit in memory; give smaller --shapes");
    }
    std::uniform_real_distribution<double> uf(-1.0, 1.0);
    std::uniform_int_distribution<int64_t> ui(0, 9);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (in.type.elem == DataType::kString)
        t.strings()[i] = "s" + std::to_string(ui(rng));
      else if (in.type.elem == DataType::kBool)
        t.set_i64(i, ui(rng) & 1);
      else if (dtype_is_float(in.type.elem))
        t.set_f64(i, uf(rng));
      else
        t.set_i64(i, ui(rng));
    }
    inputs[in.name] = ops::Value(std::move(t));
  }
  return Status::Ok();
}

Result<std::map<std::string, Dims>> parse_shapes(const std::string& spec) {
  std::map<std::string, Dims> out;
  size_t p = 0;
  while (p < spec.size()) {
    size_t comma = spec.find(',', p);
    std::string item = spec.substr(p, comma == std::string::npos ? std::string::npos : comma - p);
    p = comma == std::string::npos ? spec.size() : comma + 1;
    size_t colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return InvalidArgument("shape '", item, "' must look like NAME:1x3x224x224");
    Dims d;
    std::string dims = item.substr(colon + 1);
    size_t q = 0;
    while (q <= dims.size() && !dims.empty()) {
      size_t x = dims.find('x', q);
      std::string num = dims.substr(q, x == std::string::npos ? std::string::npos : x - q);
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(num.c_str(), &end, 10);
      if (num.empty() || *end != '\0' || v < 0 || !std::isdigit(static_cast<unsigned char>(num[0])))
        return InvalidArgument("shape '", item, "': '", num, "' is not a dimension");
      if (errno == ERANGE) return InvalidArgument("shape '", item, "': dimension '", num, "' is too large");
      d.push_back(v);
      if (x == std::string::npos) break;
      q = x + 1;
    }
    KILN_RETURN_IF_ERROR(checked_numel(d, "shape '" + item + "'").status());
    out[item.substr(0, colon)] = d;
  }
  return out;
}

std::string summarize(const std::string& name, const ops::Value& v) {
  char buf[512];
  if (v.is_none()) return name + ": <none>";
  if (v.is_sequence()) return name + ": sequence of " + std::to_string(v.sequence.size()) + " tensors";
  const Tensor& t = v.tensor;
  if (t.dtype() == DataType::kString || t.numel() == 0) return name + ": " + t.describe();
  double mn = INFINITY, mx = -INFINITY, sum = 0;
  int64_t nan = 0, inf = 0, finite = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    double x = t.get_f64(i);
    if (std::isnan(x)) {
      ++nan;
      continue;
    }
    if (std::isinf(x)) {
      ++inf;
      continue;
    }
    mn = std::min(mn, x);
    mx = std::max(mx, x);
    sum += x;
    ++finite;
  }
  std::snprintf(buf, sizeof buf, "%s: shape %s dtype %s min %.6g max %.6g mean %.6g NaN %lld Inf %lld", name.c_str(),
                dims_str(t.shape()).c_str(), dtype_name(t.dtype()), finite ? mn : NAN, finite ? mx : NAN,
                finite ? sum / static_cast<double>(finite) : NAN, static_cast<long long>(nan),
                static_cast<long long>(inf));
  return buf;
}

// ONNX's runner: |actual - expected| <= atol + rtol * |expected|, NaN equal to NaN.
Status compare_tensor(const std::string& name, const Tensor& got, const Tensor& want, const Tolerance& tol,
                      double* max_abs_err) {
  if (got.dtype() != want.dtype())
    return InvalidArgument("output '", name, "': dtype ", dtype_name(got.dtype()), ", expected ",
                           dtype_name(want.dtype()));
  if (got.shape() != want.shape())
    return InvalidArgument("output '", name, "': shape ", dims_str(got.shape()), ", expected ", dims_str(want.shape()));
  if (got.dtype() == DataType::kString) {
    for (int64_t i = 0; i < got.numel(); ++i)
      if (got.strings()[i] != want.strings()[i])
        return InvalidArgument("output '", name, "'[", i, "] = '", got.strings()[i], "', expected '", want.strings()[i],
                               "'");
    return Status::Ok();
  }
  bool exact = !dtype_is_float(got.dtype());
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    bool ok;
    if (exact && got.dtype() == DataType::kUInt64) {
      ok = got.data<uint64_t>()[i] == want.data<uint64_t>()[i];
    } else if (exact) {
      ok = got.get_i64(i) == want.get_i64(i);
    } else {
      double a = got.get_f64(i), e = want.get_f64(i);
      if (std::isnan(e) || std::isnan(a))
        ok = std::isnan(e) && std::isnan(a);
      else if (std::isinf(e) || std::isinf(a))
        ok = a == e;
      else {
        ok = std::fabs(a - e) <= tol.atol + tol.rtol * std::fabs(e);
        worst = std::max(worst, std::fabs(a - e));
      }
    }
    if (!ok) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (max_abs_err) *max_abs_err = worst;
  if (bad)
    return InvalidArgument("output '", name, "': ", bad, " of ", got.numel(), " elements differ (first at ", first,
                           ": got ", got.get_f64(first), ", expected ", want.get_f64(first), "; max abs err ", worst,
                           ")");
  return Status::Ok();
}

Status compare_value(const std::string& name, const ops::Value& got, const ops::Value& want, const Tolerance& tol) {
  if (got.kind != want.kind) return InvalidArgument("output '", name, "': kind differs (tensor/sequence/none)");
  if (got.is_tensor()) return compare_tensor(name, got.tensor, want.tensor, tol);
  if (got.is_sequence()) {
    if (got.sequence.size() != want.sequence.size())
      return InvalidArgument("output '", name, "': sequence of ", got.sequence.size(), ", expected ",
                             want.sequence.size());
    for (size_t i = 0; i < got.sequence.size(); ++i)
      KILN_RETURN_IF_ERROR(
          compare_tensor(name + "[" + std::to_string(i) + "]", got.sequence[i], want.sequence[i], tol));
  }
  return Status::Ok();
}

std::string sanitize_name(const std::string& name) {
  std::string s = name;
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
  if (s.empty() || s == "." || s == "..") s = "_" + s;
  return s;
}

Result<size_t> parse_size(const std::string& text, const std::string& flag) {
  auto bad = [&]() {
    return InvalidArgument(flag, " '", text, "': not a size — write e.g. 64M, 512K, 2G or a number of MiB");
  };
  if (text.empty()) return bad();
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return bad();
  }
  std::string unit = text.substr(used);
  const bool had_b = !unit.empty() && (unit.back() == 'B' || unit.back() == 'b');
  if (had_b) unit.pop_back();
  double scale = 0;
  if (unit.empty())
    scale = had_b ? 1 : 1 << 20;  // "4096B" is bytes, "64" MiB
  else if (unit == "K" || unit == "k")
    scale = 1 << 10;
  else if (unit == "M" || unit == "m")
    scale = 1 << 20;
  else if (unit == "G" || unit == "g")
    scale = 1 << 30;
  if (scale == 0 || !std::isfinite(v) || v < 0) return bad();
  const double bytes = v * scale;
  if (bytes > 1e18) return InvalidArgument(flag, " '", text, "': too large");
  return static_cast<size_t>(bytes);
}

}  // namespace kiln::tools
