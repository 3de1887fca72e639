// .npy/.npz readers on hostile files: sizes that overflow or exceed the tensor limit, members whose
// zip size disagrees with their .npy header (zip64 included), zip bombs, truncated deflate data.
#include "core/npy.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "../expect_status.h"
#include "core/checked_size.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string npy_header(const std::string& descr, const std::string& shape) {
  std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
  h += '\n';
  std::string out = "\x93NUMPY\x01";
  out += '\0';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  return out + h;
}

std::string raw_deflate(const std::string& in) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 9, Z_DEFLATED, -MAX_WBITS, 9, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, in.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

void put16(std::string& b, uint16_t v) { b.append(reinterpret_cast<const char*>(&v), 2); }
void put32(std::string& b, uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); }
void put64(std::string& b, uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); }

// One local-header zip member (no central directory: kiln reads local headers in order).
// `zip64`: sizes all-ones in the header and the real ones in a zip64 extra field.
std::string zip_member(const std::string& name, const std::string& data, uint16_t method, uint64_t usize,
                       bool zip64 = false) {
  std::string b;
  put32(b, 0x04034b50);
  put16(b, 45);
  put16(b, 0);
  put16(b, method);
  put32(b, 0);
  put32(b, 0);  // crc (not checked)
  put32(b, zip64 ? 0xffffffffu : static_cast<uint32_t>(data.size()));
  put32(b, zip64 ? 0xffffffffu : static_cast<uint32_t>(usize));
  put16(b, static_cast<uint16_t>(name.size()));
  put16(b, zip64 ? 20 : 0);
  b += name;
  if (zip64) {
    put16(b, 1);
    put16(b, 16);
    put64(b, usize);
    put64(b, data.size());
  }
  return b + data;
}

std::string temp_file(const std::string& name, const std::string& bytes) {
  std::string p = (fs::temp_directory_path() / (name + std::to_string(::getpid()))).string();
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

using kiln::testing::expect_error;

TEST(CheckedSize, OverflowNegativeAndLimit) {
  int64_t r;
  EXPECT_TRUE(checked_mul(int64_t{1} << 31, int64_t{1} << 31, &r));
  EXPECT_EQ(r, int64_t{1} << 62);
  EXPECT_FALSE(checked_mul(int64_t{1} << 32, int64_t{1} << 32, &r));
  EXPECT_FALSE(checked_mul(-1, 2, &r));
  EXPECT_FALSE(checked_add(INT64_MAX, 1, &r));
  auto n = checked_numel({99999999999, 99999999999, 3}, "x");
  expect_error(n.status(), ErrorCode::kInvalidArgument, "x: shape [99999999999,99999999999,3] has more elements");
  expect_error(checked_numel({2, -1}, "x", ErrorCode::kInvalidModel).status(), ErrorCode::kInvalidModel,
               "negative dimension -1");
  // Zero elements never overflow, whatever the other dims.
  auto z = checked_numel({0, INT64_MAX, INT64_MAX}, "x");
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z.value(), 0);
  auto big = checked_tensor_bytes(DataType::kFloat32, {1000000, 1000000}, "initializer 'w'");
  expect_error(big.status(), ErrorCode::kInvalidArgument,
               "initializer 'w': a float32 tensor of shape [1000000,1000000] would take 4000000000000 bytes");
  EXPECT_NE(big.status().message().find("KILN_MAX_TENSOR_BYTES"), std::string::npos);
  set_max_tensor_bytes(100);
  EXPECT_FALSE(checked_tensor_bytes(DataType::kFloat32, {26}, "t").ok());
  EXPECT_TRUE(checked_tensor_bytes(DataType::kFloat32, {25}, "t").ok());
  set_max_tensor_bytes(0);
  EXPECT_EQ(max_tensor_bytes(), kDefaultMaxTensorBytes);
}

TEST(Npy, RefusesHugeAndOverflowingShapesBeforeAllocating) {
  // 10^12 elements: refused by the size limit with the shape and the bytes, not bad_alloc.
  auto t = parse_npy(npy_header("<f4", "(1000000, 1000000)"), "'big.npy'");
  expect_error(t.status(), ErrorCode::kInvalidArgument, "would take 4000000000000 bytes");
  // An element count past int64 used to wrap to a tiny size and "succeed".
  auto o = parse_npy(npy_header("<f4", "(4294967296, 4294967296)"), "'wrap.npy'");
  expect_error(o.status(), ErrorCode::kInvalidArgument, "more elements than fit in 64 bits");
  expect_error(parse_npy(npy_header("<f4", "(-3,)"), "'n.npy'").status(), ErrorCode::kInvalidArgument,
               "malformed shape");
  expect_error(parse_npy(npy_header("<f4", "(99999999999999999999,)"), "'n.npy'").status(), ErrorCode::kInvalidArgument,
               "malformed shape");
  // Within the limit but larger than the file: truncated, before any allocation of that size.
  expect_error(parse_npy(npy_header("<f4", "(1000, 1000)"), "'t.npy'").status(), ErrorCode::kInvalidArgument,
               "truncated .npy data");
  expect_error(parse_npy(npy_header("<U0", "(1000000000,)"), "'s.npy'").status(), ErrorCode::kInvalidArgument,
               "unsupported string width");
  std::string ok = npy_header("<f4", "(2,)");
  float v[2] = {1.5f, -2};
  ok.append(reinterpret_cast<const char*>(v), 8);
  auto r = parse_npy(ok, "'ok.npy'");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().data<float>()[1], -2);
}

TEST(Npz, ChecksDeclaredSizesAgainstTheNpyHeaderBeforeInflating) {
  std::string member = npy_header("<f4", "(4,)") + std::string(16, '\0');
  // Well-formed, deflated and stored.
  std::string good =
      zip_member("x.npy", raw_deflate(member), 8, member.size()) + zip_member("y.npy", member, 0, member.size());
  auto ok = read_npz(temp_file("kiln_npz_ok", good));
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  ASSERT_EQ(ok.value().size(), 2u);
  EXPECT_EQ(ok.value()[0].first, "x");
  EXPECT_EQ(ok.value()[1].second.numel(), 4);

  // zip64 sizes are read whole: the same member with its sizes in a zip64 extra field loads...
  auto z64 = read_npz(temp_file("kiln_npz_z64", zip_member("x.npy", raw_deflate(member), 8, member.size(), true)));
  ASSERT_TRUE(z64.ok()) << z64.status().to_string();
  // ...and one declaring 2^32 bytes more than it holds is refused (only the low 32 bits were kept).
  auto lie64 = read_npz(temp_file(
      "kiln_npz_lie64", zip_member("x.npy", raw_deflate(member), 8, member.size() + (uint64_t{1} << 32), true)));
  expect_error(lie64.status(), ErrorCode::kInvalidArgument, "refused before inflating");

  // A zip bomb: 1 GiB of zeros declared, its .npy header says 16 bytes. Refused before inflating.
  std::string bomb_head = npy_header("<f4", "(4,)");
  std::string bomb = zip_member("x.npy", raw_deflate(bomb_head + std::string(size_t{1} << 24, '\0')), 8,
                                bomb_head.size() + (size_t{1} << 30));
  auto b = read_npz(temp_file("kiln_npz_bomb", bomb));
  expect_error(b.status(), ErrorCode::kInvalidArgument, "needs 144 — a damaged or hand-made file");
  // A member whose zip size matches its header but whose stream inflates to more than that.
  std::string more = zip_member("x.npy", raw_deflate(member + std::string(1000, '\0')), 8, member.size());
  expect_error(read_npz(temp_file("kiln_npz_more", more)).status(), ErrorCode::kInvalidArgument,
               "more than the declared");
  // Truncated compressed data.
  std::string cut = raw_deflate(member);
  cut.resize(cut.size() / 2);
  expect_error(read_npz(temp_file("kiln_npz_cut", zip_member("x.npy", cut, 8, member.size()))).status(),
               ErrorCode::kInvalidArgument, "corrupted deflate data");
  // A huge declared tensor in a member: the tensor limit, not bad_alloc.
  std::string huge = npy_header("<f8", "(100000000000,)");
  expect_error(read_npz(temp_file("kiln_npz_huge", zip_member("x.npy", raw_deflate(huge), 8, huge.size()))).status(),
               ErrorCode::kInvalidArgument, "would take 800000000000 bytes");
  for (const char* n : {"kiln_npz_ok", "kiln_npz_z64", "kiln_npz_lie64", "kiln_npz_bomb", "kiln_npz_more",
                        "kiln_npz_cut", "kiln_npz_huge"})
    fs::remove(fs::temp_directory_path() / (n + std::to_string(::getpid())));
}

TEST(Npz, AFifoIsANamedErrorNotAHang) {
  std::string p = (fs::temp_directory_path() / ("kiln_npz_fifo" + std::to_string(::getpid()))).string();
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  expect_error(read_npz(p).status(), ErrorCode::kInvalidArgument, "is a FIFO");
  expect_error(read_npy(p).status(), ErrorCode::kInvalidArgument, "is a FIFO");
  fs::remove(p);
}

}  // namespace
}  // namespace kiln
