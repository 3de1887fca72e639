#include "core/npy.h"

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <sstream>

namespace kiln {

namespace {

Result<std::string> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound("cannot open '", path, "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct NpyDescr {
  DataType dt;
  const char* code;
};
constexpr NpyDescr kDescrs[] = {
    {DataType::kFloat32, "f4"}, {DataType::kFloat64, "f8"}, {DataType::kFloat16, "f2"}, {DataType::kInt8, "i1"},
    {DataType::kInt16, "i2"},   {DataType::kInt32, "i4"},   {DataType::kInt64, "i8"},   {DataType::kUInt8, "u1"},
    {DataType::kUInt16, "u2"},  {DataType::kUInt32, "u4"},  {DataType::kUInt64, "u8"},  {DataType::kBool, "b1"},
};

// Value of 'key': ... in the header dict, as raw text up to the next top-level comma or brace.
std::string dict_value(const std::string& h, const std::string& key) {
  size_t p = h.find("'" + key + "'");
  if (p == std::string::npos) return "";
  p = h.find(':', p);
  if (p == std::string::npos) return "";
  ++p;
  int depth = 0;
  size_t start = p;
  for (; p < h.size(); ++p) {
    char c = h[p];
    if (c == '(' || c == '[')
      ++depth;
    else if (c == ')' || c == ']')
      --depth;
    else if ((c == ',' || c == '}') && depth == 0)
      break;
  }
  std::string v = h.substr(start, p - start);
  size_t a = v.find_first_not_of(" "), b = v.find_last_not_of(" ");
  return a == std::string::npos ? "" : v.substr(a, b - a + 1);
}

}  // namespace

Result<Tensor> parse_npy(const std::string& bytes, const std::string& what) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    return InvalidArgument(what, ": not a .npy file (bad magic)");
  int major = static_cast<uint8_t>(bytes[6]);
  size_t header_len, offset;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return InvalidArgument(what, ": truncated .npy header");
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    offset = 12;
  } else {
    return InvalidArgument(what, ": unsupported .npy version ", major);
  }
  if (offset + header_len > bytes.size()) return InvalidArgument(what, ": truncated .npy header");
  std::string h = bytes.substr(offset, header_len);
  std::string descr = dict_value(h, "descr");
  std::string fortran = dict_value(h, "fortran_order");
  std::string shape_s = dict_value(h, "shape");
  if (descr.size() < 4 || shape_s.empty()) return InvalidArgument(what, ": malformed .npy header '", h, "'");
  if (fortran == "True")
    return Unsupported(what, ": Fortran-ordered arrays are not supported; save with np.ascontiguousarray");
  descr = descr.substr(1, descr.size() - 2);  // strip quotes
  char endian = descr[0];
  std::string code = descr.substr(1);
  if (endian == '>') return Unsupported(what, ": big-endian arrays are not supported");
  Dims dims;
  {
    std::string inner = shape_s.substr(1, shape_s.size() - 2);
    std::stringstream ss(inner);
    std::string item;
    while (std::getline(ss, item, ',')) {
      size_t a = item.find_first_not_of(" ");
      if (a == std::string::npos) continue;
      try {
        long long d = std::stoll(item.substr(a));
        if (d < 0) return InvalidArgument(what, ": negative dimension in .npy header");
        dims.push_back(d);
      } catch (...) {
        return InvalidArgument(what, ": malformed shape '", shape_s, "'");
      }
    }
  }
  size_t data_off = offset + header_len;
  if (code[0] == 'U') {  // fixed-width UTF-32 strings
    int width = std::atoi(code.c_str() + 1);
    Tensor t(DataType::kString, dims);
    size_t need = static_cast<size_t>(t.numel()) * static_cast<size_t>(width) * 4;
    if (bytes.size() - data_off < need) return InvalidArgument(what, ": truncated .npy data");
    for (int64_t i = 0; i < t.numel(); ++i) {
      std::string s;
      for (int c = 0; c < width; ++c) {
        uint32_t cp;
        std::memcpy(&cp, bytes.data() + data_off + (static_cast<size_t>(i) * width + c) * 4, 4);
        if (cp == 0) break;
        if (cp < 0x80)
          s += static_cast<char>(cp);
        else if (cp < 0x800) {
          s += static_cast<char>(0xC0 | (cp >> 6));
          s += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          s += static_cast<char>(0xE0 | (cp >> 12));
          s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          s += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
          s += static_cast<char>(0xF0 | (cp >> 18));
          s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
          s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          s += static_cast<char>(0x80 | (cp & 0x3F));
        }
      }
      t.strings()[i] = s;
    }
    return t;
  }
  DataType dt = DataType::kUndefined;
  for (const auto& d : kDescrs)
    if (code == d.code) dt = d.dt;
  if (code == "?") dt = DataType::kBool;
  if (dt == DataType::kUndefined) return Unsupported(what, ": unsupported .npy dtype '", descr, "'");
  Tensor t(dt, dims);
  if (bytes.size() - data_off < t.nbytes())
    return InvalidArgument(what, ": truncated .npy data (", bytes.size() - data_off, " bytes, need ", t.nbytes(), ")");
  if (t.nbytes()) std::memcpy(t.raw(), bytes.data() + data_off, t.nbytes());
  return t;
}

std::string serialize_npy(const Tensor& t) {
  std::string descr;
  size_t width = 0;
  if (t.dtype() == DataType::kString) {
    for (int64_t i = 0; i < t.numel(); ++i) width = std::max(width, t.strings()[i].size());
    width = std::max<size_t>(width, 1);
    descr = "<U" + std::to_string(width);
  } else if (t.dtype() == DataType::kBool) {
    descr = "|b1";
  } else {
    for (const auto& d : kDescrs)
      if (d.dt == t.dtype()) descr = std::string(dtype_size(t.dtype()) == 1 ? "|" : "<") + d.code;
  }
  if (descr.empty()) {  // bfloat16, float8, ...: stored as float32
    return serialize_npy(t.cast(DataType::kFloat32).value());
  }
  std::string shape = "(";
  for (size_t i = 0; i < t.shape().size(); ++i)
    shape += std::to_string(t.shape()[i]) + (t.shape().size() == 1 ? "," : (i + 1 < t.shape().size() ? ", " : ""));
  shape += ")";
  std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>((h.size() >> 8) & 0xff);
  out += h;
  if (t.dtype() == DataType::kString) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      const std::string& s = t.strings()[i];
      std::string cell(width * 4, '\0');
      for (size_t c = 0; c < s.size() && c < width; ++c) cell[c * 4] = s[c];  // ASCII subset
      out += cell;
    }
  } else {
    out.append(static_cast<const char*>(t.raw()), t.nbytes());
  }
  return out;
}

Result<Tensor> read_npy(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string b, slurp(path));
  return parse_npy(b, "'" + path + "'");
}

Status write_npy(const std::string& path, const Tensor& t) {
  std::ofstream f(path, std::ios::binary);
  std::string b = serialize_npy(t);
  if (!f.write(b.data(), static_cast<std::streamsize>(b.size()))) return IOError("cannot write '", path, "'");
  return Status::Ok();
}

namespace {
uint32_t rd32(const std::string& b, size_t p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(b[p + i])) << (8 * i);
  return v;
}
uint16_t rd16(const std::string& b, size_t p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(b[p]) | (static_cast<uint8_t>(b[p + 1]) << 8));
}
void wr32(std::string& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b += static_cast<char>((v >> (8 * i)) & 0xff);
}
void wr16(std::string& b, uint16_t v) {
  b += static_cast<char>(v & 0xff);
  b += static_cast<char>(v >> 8);
}
}  // namespace

Result<std::vector<std::pair<std::string, Tensor>>> read_npz(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string b, slurp(path));
  std::vector<std::pair<std::string, Tensor>> out;
  size_t p = 0;
  while (p + 30 <= b.size() && rd32(b, p) == 0x04034b50) {
    uint16_t flags = rd16(b, p + 6), method = rd16(b, p + 8);
    uint32_t csize = rd32(b, p + 18), usize = rd32(b, p + 22);
    uint16_t nlen = rd16(b, p + 26), xlen = rd16(b, p + 28);
    if (p + 30 + nlen + xlen > b.size()) return InvalidArgument("'", path, "': truncated zip entry");
    std::string name = b.substr(p + 30, nlen);
    size_t data = p + 30 + nlen + xlen;
    if (flags & 0x8) return Unsupported("'", path, "': zip entries with data descriptors are not supported");
    if (csize == 0xffffffffu || usize == 0xffffffffu) {  // zip64: sizes in the extra field
      size_t x = p + 30 + nlen;
      while (x + 4 <= data) {
        uint16_t id = rd16(b, x), sz = rd16(b, x + 2);
        if (id == 1 && x + 4 + 16 <= b.size()) {
          usize = rd32(b, x + 4);
          csize = rd32(b, x + 12);
        }
        x += 4 + sz;
      }
    }
    if (data + csize > b.size()) return InvalidArgument("'", path, "': truncated zip entry '", name, "'");
    std::string content;
    if (method == 0) {
      content = b.substr(data, csize);
    } else if (method == 8) {
      content.resize(usize);
      z_stream zs{};
      if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) return Internal("zlib init failed");
      zs.next_in = reinterpret_cast<Bytef*>(b.data() + data);
      zs.avail_in = csize;
      zs.next_out = reinterpret_cast<Bytef*>(content.data());
      zs.avail_out = usize;
      int rc = inflate(&zs, Z_FINISH);
      inflateEnd(&zs);
      if (rc != Z_STREAM_END) return InvalidArgument("'", path, "': corrupted deflate data in '", name, "'");
    } else {
      return Unsupported("'", path, "': zip compression method ", method, " is not supported");
    }
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0) name.resize(name.size() - 4);
    KILN_ASSIGN_OR_RETURN(Tensor t, parse_npy(content, "'" + path + "' entry '" + name + "'"));
    out.emplace_back(name, std::move(t));
    p = data + csize;
  }
  if (out.empty() && !(b.size() >= 4 && rd32(b, 0) == 0x06054b50))
    return InvalidArgument("'", path, "' is not an .npz (zip) archive");
  return out;
}

Status write_npz(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& entries) {
  std::string zip, central;
  for (const auto& [name, t] : entries) {
    std::string fname = name + ".npy";
    std::string data = serialize_npy(t);
    uint32_t crc =
        static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
    uint32_t offset = static_cast<uint32_t>(zip.size());
    wr32(zip, 0x04034b50);
    wr16(zip, 20);
    wr16(zip, 0);
    wr16(zip, 0);
    wr16(zip, 0);
    wr16(zip, 0);
    wr32(zip, crc);
    wr32(zip, static_cast<uint32_t>(data.size()));
    wr32(zip, static_cast<uint32_t>(data.size()));
    wr16(zip, static_cast<uint16_t>(fname.size()));
    wr16(zip, 0);
    zip += fname;
    zip += data;
    wr32(central, 0x02014b50);
    wr16(central, 20);
    wr16(central, 20);
    wr16(central, 0);
    wr16(central, 0);
    wr16(central, 0);
    wr16(central, 0);
    wr32(central, crc);
    wr32(central, static_cast<uint32_t>(data.size()));
    wr32(central, static_cast<uint32_t>(data.size()));
    wr16(central, static_cast<uint16_t>(fname.size()));
    wr16(central, 0);
    wr16(central, 0);
    wr16(central, 0);
    wr16(central, 0);
    wr32(central, 0);
    wr32(central, offset);
    central += fname;
  }
  uint32_t cd_off = static_cast<uint32_t>(zip.size());
  zip += central;
  wr32(zip, 0x06054b50);
  wr16(zip, 0);
  wr16(zip, 0);
  wr16(zip, static_cast<uint16_t>(entries.size()));
  wr16(zip, static_cast<uint16_t>(entries.size()));
  wr32(zip, static_cast<uint32_t>(central.size()));
  wr32(zip, cd_off);
  wr16(zip, 0);
  std::ofstream f(path, std::ios::binary);
  if (!f.write(zip.data(), static_cast<std::streamsize>(zip.size()))) return IOError("cannot write '", path, "'");
  return Status::Ok();
}

}  // namespace kiln
