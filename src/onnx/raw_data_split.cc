#include "onnx/raw_data_split.h"

#include <vector>

namespace kiln::onnx_import {

namespace {

// Field numbers (onnx.proto3).
constexpr uint32_t kModelGraph = 7;
constexpr uint32_t kGraphInitializer = 5;
constexpr uint32_t kTensorSegment = 3, kTensorRawData = 9, kTensorExternalData = 13, kTensorDataLocation = 14;
constexpr uint32_t kWireVarint = 0, kWireFixed64 = 1, kWireLen = 2, kWireFixed32 = 5;

struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;

  bool done() const { return p >= end; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) break;
      uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    ok = false;
    return 0;
  }
};

// One field: its number and wire type, where it starts (tag included), and for LEN fields the payload.
struct Field {
  uint32_t number = 0, wire = 0;
  const uint8_t* begin = nullptr;
  const uint8_t* end = nullptr;
  const uint8_t* payload = nullptr;
  size_t payload_len = 0;
};

bool next_field(Reader& r, Field& f) {
  f.begin = r.p;
  uint64_t tag = r.varint();
  if (!r.ok || tag >> 3 == 0 || tag >> 3 > 0x1fffffff) return false;
  f.number = static_cast<uint32_t>(tag >> 3);
  f.wire = static_cast<uint32_t>(tag & 7);
  switch (f.wire) {
    case kWireVarint: r.varint(); break;
    case kWireFixed64:
      if (r.end - r.p < 8) return false;
      r.p += 8;
      break;
    case kWireFixed32:
      if (r.end - r.p < 4) return false;
      r.p += 4;
      break;
    case kWireLen: {
      uint64_t n = r.varint();
      if (!r.ok || n > static_cast<uint64_t>(r.end - r.p)) return false;
      f.payload = r.p;
      f.payload_len = static_cast<size_t>(n);
      r.p += n;
      break;
    }
    default: return false;  // groups (3, 4) and reserved types: leave the input to protobuf
  }
  f.end = r.p;
  return r.ok;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_len_field(std::string& out, uint32_t number, std::string_view payload) {
  put_varint(out, (uint64_t{number} << 3) | kWireLen);
  put_varint(out, payload.size());
  out.append(payload);
}
void put_raw(std::string& out, const uint8_t* b, const uint8_t* e) {
  out.append(reinterpret_cast<const char*>(b), static_cast<size_t>(e - b));
}

struct Splitter {
  const uint8_t* base;  // the model's first byte: offsets are relative to it
  size_t min_bytes;
  bool changed = false;

  // A TensorProto: the same fields, with a large raw_data replaced by an external-data reference.
  bool tensor(const uint8_t* b, const uint8_t* e, std::string& out) {
    Reader r{b, e};
    Field f, raw;
    int raw_count = 0;
    bool external = false;
    while (!r.done()) {
      if (!next_field(r, f)) return false;
      if (f.number == kTensorRawData && f.wire == kWireLen) raw = f, ++raw_count;
      if (f.number == kTensorExternalData || f.number == kTensorDataLocation || f.number == kTensorSegment)
        external = true;
    }
    if (raw_count != 1 || external || raw.payload_len < min_bytes) {
      put_raw(out, b, e);
      return true;
    }
    put_raw(out, b, raw.begin);
    put_raw(out, raw.end, e);
    auto entry = [&](std::string_view key, std::string_view value) {
      std::string kv;
      put_len_field(kv, 1, key);
      put_len_field(kv, 2, value);
      put_len_field(out, kTensorExternalData, kv);
    };
    entry("location", kDetachedLocation);
    entry("offset", std::to_string(raw.payload - base));
    entry("length", std::to_string(raw.payload_len));
    put_varint(out, (uint64_t{kTensorDataLocation} << 3) | kWireVarint);
    put_varint(out, 1);  // EXTERNAL
    changed = true;
    return true;
  }

  // A message whose field `child` (LEN) is rewritten by `fn`; every other field is copied as is.
  template <typename Fn>
  bool message(const uint8_t* b, const uint8_t* e, uint32_t child, std::string& out, Fn&& fn) {
    Reader r{b, e};
    Field f;
    std::string sub;
    while (!r.done()) {
      if (!next_field(r, f)) return false;
      if (f.number != child || f.wire != kWireLen) {
        put_raw(out, f.begin, f.end);
        continue;
      }
      sub.clear();
      if (!fn(f.payload, f.payload + f.payload_len, sub)) return false;
      put_len_field(out, child, sub);
    }
    return true;
  }
};

}  // namespace

std::optional<std::string> detach_raw_data(std::string_view model, size_t min_bytes) {
  const auto* b = reinterpret_cast<const uint8_t*>(model.data());
  Splitter s{b, std::max<size_t>(min_bytes, 1)};
  std::string out;
  bool ok = s.message(b, b + model.size(), kModelGraph, out, [&](const uint8_t* gb, const uint8_t* ge, std::string& g) {
    return s.message(gb, ge, kGraphInitializer, g,
                     [&](const uint8_t* tb, const uint8_t* te, std::string& t) { return s.tensor(tb, te, t); });
  });
  if (!ok || !s.changed) return std::nullopt;
  return out;
}

}  // namespace kiln::onnx_import
