#include "core/npy.h"

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "core/checked_size.h"
#include "core/mapped_file.h"

namespace kiln {

namespace {

struct NpyDescr {
  DataType dt;
  const char* code;
};
constexpr NpyDescr kDescrs[] = {
    {DataType::kFloat32, "f4"}, {DataType::kFloat64, "f8"}, {DataType::kFloat16, "f2"}, {DataType::kInt8, "i1"},
    {DataType::kInt16, "i2"},   {DataType::kInt32, "i4"},   {DataType::kInt64, "i8"},   {DataType::kUInt8, "u1"},
    {DataType::kUInt16, "u2"},  {DataType::kUInt32, "u4"},  {DataType::kUInt64, "u8"},  {DataType::kBool, "b1"},
};

// numpy writes headers of a few hundred bytes (and its own reader refuses more than 10,000 by
// default); a larger one is not a file numpy made.
constexpr size_t kMaxNpyHeader = size_t{1} << 20;
constexpr int64_t kMaxStringWidth = int64_t{1} << 20;

// Value of 'key': ... in the header dict, as raw text up to the next top-level comma or brace.
std::string dict_value(std::string_view h, const std::string& key) {
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
  std::string v(h.substr(start, p - start));
  size_t a = v.find_first_not_of(" "), b = v.find_last_not_of(" ");
  return a == std::string::npos ? "" : v.substr(a, b - a + 1);
}

// A non-negative decimal integer, digits only (no sign, no suffix), that fits in int64.
bool parse_dim(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

// What an .npy header declares; data_bytes is checked for overflow and the tensor-size limit.
struct NpyHeader {
  DataType dt = DataType::kUndefined;
  Dims dims;
  int64_t str_width = 0;  // kString: code points per element
  size_t data_off = 0, data_bytes = 0;
};

// The header's length from the first bytes (10 or 12 needed); 0 bytes more to read when known.
Result<size_t> npy_header_end(std::string_view bytes, const std::string& what) {
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
  if (header_len > kMaxNpyHeader)
    return InvalidArgument(what, ": .npy header of ", header_len, " bytes is larger than the ", kMaxNpyHeader,
                           " bytes kiln reads (numpy writes a few hundred)");
  return offset + header_len;
}

Result<NpyHeader> parse_npy_header(std::string_view bytes, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(size_t end, npy_header_end(bytes, what));
  if (end > bytes.size()) return InvalidArgument(what, ": truncated .npy header");
  size_t offset = static_cast<uint8_t>(bytes[6]) == 1 ? 10 : 12;
  std::string_view h = bytes.substr(offset, end - offset);
  std::string descr = dict_value(h, "descr");
  std::string fortran = dict_value(h, "fortran_order");
  std::string shape_s = dict_value(h, "shape");
  if (descr.size() < 4 || shape_s.size() < 2 || shape_s.front() != '(' || shape_s.back() != ')')
    return InvalidArgument(what, ": malformed .npy header '", std::string(h.substr(0, 200)), "'");
  if (fortran == "True")
    return Unsupported(what, ": Fortran-ordered arrays are not supported; save with np.ascontiguousarray");
  descr = descr.substr(1, descr.size() - 2);  // strip quotes
  char endian = descr[0];
  std::string code = descr.substr(1);
  if (endian == '>') return Unsupported(what, ": big-endian arrays are not supported");
  NpyHeader r;
  {
    std::string inner = shape_s.substr(1, shape_s.size() - 2);
    std::stringstream ss(inner);
    std::string item;
    while (std::getline(ss, item, ',')) {
      size_t a = item.find_first_not_of(" "), b = item.find_last_not_of(" ");
      if (a == std::string::npos) continue;
      int64_t d;
      if (!parse_dim(item.substr(a, b - a + 1), &d))
        return InvalidArgument(what, ": malformed shape '", shape_s, "' in the .npy header (dims must be ",
                               "non-negative integers below 2^63)");
      r.dims.push_back(d);
    }
  }
  r.data_off = end;
  int64_t elem_bytes;
  if (code[0] == 'U') {  // fixed-width UTF-32 strings
    if (!parse_dim(code.substr(1), &r.str_width) || r.str_width < 1 || r.str_width > kMaxStringWidth)
      return InvalidArgument(what, ": unsupported string width in .npy dtype '", descr, "'");
    r.dt = DataType::kString;
    elem_bytes = r.str_width * 4;
  } else {
    for (const auto& d : kDescrs)
      if (code == d.code) r.dt = d.dt;
    if (code == "?") r.dt = DataType::kBool;
    if (r.dt == DataType::kUndefined) return Unsupported(what, ": unsupported .npy dtype '", descr, "'");
    elem_bytes = static_cast<int64_t>(dtype_size(r.dt));
  }
  KILN_RETURN_IF_ERROR(checked_tensor_bytes(r.dt, r.dims, what).status());
  KILN_ASSIGN_OR_RETURN(int64_t numel, checked_numel(r.dims, what));
  int64_t data_bytes;
  if (!checked_mul(numel, elem_bytes, &data_bytes))
    return InvalidArgument(what, ": shape ", dims_str(r.dims), " of ", descr, " overflows 64 bits of bytes");
  r.data_bytes = static_cast<size_t>(data_bytes);
  return r;
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    cp = std::min<uint32_t>(cp, 0x10FFFF);  // beyond Unicode: clamp rather than emit a 5-byte form
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

Result<Tensor> parse_npy(std::string_view bytes, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(NpyHeader h, parse_npy_header(bytes, what));
  // Every size is checked against the bytes present before anything is allocated.
  if (bytes.size() - h.data_off < h.data_bytes)
    return InvalidArgument(what, ": truncated .npy data (", bytes.size() - h.data_off, " bytes, its shape ",
                           dims_str(h.dims), " needs ", h.data_bytes, ")");
  const char* data = bytes.data() + h.data_off;
  if (h.dt == DataType::kString) {
    Tensor t(DataType::kString, h.dims);
    size_t width = static_cast<size_t>(h.str_width);
    for (int64_t i = 0; i < t.numel(); ++i) {
      std::string s;
      for (size_t c = 0; c < width; ++c) {
        uint32_t cp;
        std::memcpy(&cp, data + (static_cast<size_t>(i) * width + c) * 4, 4);
        if (cp == 0) break;
        append_utf8(s, cp);
      }
      t.strings()[i] = s;
    }
    return t;
  }
  Tensor t = Tensor::uninitialized(h.dt, h.dims);
  if (t.nbytes()) std::memcpy(t.raw(), data, t.nbytes());
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
  KILN_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  return parse_npy(file->view(), "'" + path + "'");
}

Status write_npy(const std::string& path, const Tensor& t) {
  std::ofstream f(path, std::ios::binary);
  std::string b = serialize_npy(t);
  if (!f.write(b.data(), static_cast<std::streamsize>(b.size()))) return IOError("cannot write '", path, "'");
  return Status::Ok();
}

namespace {
uint32_t rd32(std::string_view b, size_t p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(b[p + i])) << (8 * i);
  return v;
}
uint16_t rd16(std::string_view b, size_t p) {
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

namespace {
uint64_t rd64(std::string_view b, size_t p) {
  return static_cast<uint64_t>(rd32(b, p)) | (static_cast<uint64_t>(rd32(b, p + 4)) << 32);
}

// Inflates a deflated member: first its .npy header, then (once the header's shape says how many
// bytes the member must hold, and that agrees with the size the zip declares) the rest, in bounded
// steps into a buffer of exactly that size.
Result<std::string> inflate_member(std::string_view in, uint64_t usize, const std::string& what) {
  z_stream zs{};
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) return Internal("zlib init failed");
  struct End {
    z_stream* z;
    ~End() { inflateEnd(z); }
  } end{&zs};
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  std::string out;
  size_t in_left = in.size();
  int rc = Z_OK;
  // Inflates until `out` holds `target` bytes or the stream ends.
  auto inflate_to = [&](size_t target) -> Status {
    while (out.size() < target && rc != Z_STREAM_END) {
      size_t have = out.size(), step = std::min<size_t>(target - have, size_t{1} << 20);
      out.resize(have + step);
      zs.next_out = reinterpret_cast<Bytef*>(out.data() + have);
      zs.avail_out = static_cast<uInt>(step);
      if (zs.avail_in == 0 && in_left > 0) {
        uInt take = static_cast<uInt>(std::min<size_t>(in_left, size_t{1} << 30));
        zs.avail_in = take;
        in_left -= take;
      }
      rc = inflate(&zs, Z_NO_FLUSH);
      out.resize(have + step - zs.avail_out);
      if (rc == Z_BUF_ERROR && zs.avail_in == 0 && in_left == 0)
        return InvalidArgument(what, ": corrupted deflate data (the compressed stream ends early)");
      if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
        return InvalidArgument(what, ": corrupted deflate data (", zs.msg ? zs.msg : "zlib error", ")");
    }
    return Status::Ok();
  };
  KILN_RETURN_IF_ERROR(inflate_to(std::min<uint64_t>(usize, 12)));
  KILN_ASSIGN_OR_RETURN(size_t header_end, npy_header_end(out, what));
  KILN_RETURN_IF_ERROR(inflate_to(std::min<uint64_t>(usize, header_end)));
  KILN_ASSIGN_OR_RETURN(NpyHeader h, parse_npy_header(out, what));
  uint64_t need = static_cast<uint64_t>(h.data_off) + h.data_bytes;
  if (usize != need)
    return InvalidArgument(what, ": the archive says the member holds ", usize, " bytes but its .npy header (shape ",
                           dims_str(h.dims), ") needs ", need, " — a damaged or hand-made file; refused before ",
                           "inflating it");
  KILN_RETURN_IF_ERROR(inflate_to(need));
  if (out.size() != need) return InvalidArgument(what, ": corrupted deflate data (it ends before ", need, " bytes)");
  if (rc != Z_STREAM_END) {  // exactly `need` bytes so far: the stream must end here
    if (zs.avail_in == 0 && in_left > 0) {
      uInt take = static_cast<uInt>(std::min<size_t>(in_left, size_t{1} << 30));
      zs.avail_in = take;
      in_left -= take;
    }
    unsigned char extra;
    zs.next_out = &extra;
    zs.avail_out = 1;
    rc = inflate(&zs, Z_FINISH);
    if (rc != Z_STREAM_END || zs.avail_out == 0)
      return InvalidArgument(what, ": corrupted deflate data (more than the declared ", need, " bytes)");
  }
  return out;
}
}  // namespace

Result<std::vector<std::pair<std::string, Tensor>>> read_npz(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  std::string_view b = file->view();
  std::vector<std::pair<std::string, Tensor>> out;
  size_t p = 0;
  while (p + 30 <= b.size() && rd32(b, p) == 0x04034b50) {
    uint16_t flags = rd16(b, p + 6), method = rd16(b, p + 8);
    uint64_t csize = rd32(b, p + 18), usize = rd32(b, p + 22);
    uint16_t nlen = rd16(b, p + 26), xlen = rd16(b, p + 28);
    if (p + 30 + nlen + xlen > b.size()) return InvalidArgument("'", path, "': truncated zip entry");
    std::string name(b.substr(p + 30, nlen));
    size_t data = p + 30 + nlen + xlen;
    if (flags & 0x8) return Unsupported("'", path, "': zip entries with data descriptors are not supported");
    if (csize == 0xffffffffu || usize == 0xffffffffu) {
      // zip64: the extra field holds, in this order, the 64-bit sizes whose 32-bit fields are all ones.
      bool found = false;
      for (size_t x = p + 30 + nlen; x + 4 <= data;) {
        uint16_t id = rd16(b, x), sz = rd16(b, x + 2);
        if (x + 4 + sz > data) break;
        if (id == 1) {
          size_t at = x + 4, lim = x + 4 + sz;
          if (usize == 0xffffffffu && at + 8 <= lim) usize = rd64(b, at), at += 8;
          if (csize == 0xffffffffu && at + 8 <= lim) csize = rd64(b, at), at += 8;
          found = true;
          break;
        }
        x += 4 + sz;
      }
      if (!found) return InvalidArgument("'", path, "': zip entry '", name, "' has no zip64 size field");
    }
    std::string what = "'" + path + "' entry '" + name + "'";
    if (csize > b.size() - data) return InvalidArgument("'", path, "': truncated zip entry '", name, "'");
    std::string_view member = b.substr(data, static_cast<size_t>(csize));
    std::string inflated;
    if (method == 0) {
      if (usize != csize)
        return InvalidArgument(what, ": a stored member of ", csize, " bytes declares ", usize, " uncompressed");
    } else if (method == 8) {
      KILN_ASSIGN_OR_RETURN(inflated, inflate_member(member, usize, what));
      member = inflated;
    } else {
      return Unsupported("'", path, "': zip compression method ", method, " is not supported");
    }
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0) name.resize(name.size() - 4);
    KILN_ASSIGN_OR_RETURN(Tensor t, parse_npy(member, "'" + path + "' entry '" + name + "'"));
    out.emplace_back(name, std::move(t));
    p = data + static_cast<size_t>(csize);
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
