// Engine files from other people: checked (size, magic, version, lengths) before anything is
// copied or mapped, a header JSON nested too deep or with fields of the wrong type, profiles whose
// ranks differ or whose element count overflows, and files that are not regular files.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "../expect_status.h"
#include "core/checksum.h"
#include "engine/engine_impl.h"
#include "kiln/kiln.h"
#include "onnx/onnx.pb.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// y = Relu(x), x float32[1,4].
std::string relu_onnx() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  g->set_name("g");
  g->add_input()->set_name("x");
  g->add_output()->set_name("y");
  for (auto* vi : {g->mutable_input(0), g->mutable_output(0)}) {
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(1);
    tt->mutable_shape()->add_dim()->set_dim_value(1);
    tt->mutable_shape()->add_dim()->set_dim_value(4);
  }
  auto* n = g->add_node();
  n->set_op_type("Relu");
  n->add_input("x");
  n->add_output("y");
  return m.SerializeAsString();
}

const std::string& engine_bytes() {
  static const std::string bytes = Builder().build_from_memory(relu_onnx())->serialize();
  return bytes;
}

std::string header_of(const std::string& file) {
  uint32_t hl;
  std::memcpy(&hl, file.data() + 12, 4);
  return file.substr(32, hl);
}

// The engine with its header JSON replaced (lengths and both checksums made right again), so that
// what is tested is the JSON's handling, not the checksum's.
std::string with_header(const std::string& file, const std::string& header) {
  uint32_t hl;
  std::memcpy(&hl, file.data() + 12, 4);
  size_t old_body_start = (32 + hl + 63) / 64 * 64;
  std::string body = file.substr(old_body_start);
  std::string out = file.substr(0, 32) + header;
  out.append((64 - out.size() % 64) % 64, '\0');
  out += body;
  uint32_t nhl = static_cast<uint32_t>(header.size());
  std::memcpy(out.data() + 12, &nhl, 4);
  uint32_t hc = crc32c(0, out.data() + 32, header.size());
  uint32_t bc = crc32c(0, out.data() + 32 + header.size(), out.size() - 32 - header.size());
  std::memcpy(out.data() + 24, &hc, 4);
  std::memcpy(out.data() + 28, &bc, 4);
  return out;
}

using kiln::testing::expect_error;

TEST(EngineFileHostile, HeaderRewriteKeepsAGoodEngineLoadable) {
  auto e = detail::deserialize_engine(with_header(engine_bytes(), header_of(engine_bytes())));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
}

TEST(EngineFileHostile, DeepJsonIsANamedErrorNotAStackOverflow) {
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto h = nlohmann::json::parse(header_of(engine_bytes()));
  std::string text = h.dump();
  text.insert(text.size() - 1, ",\"extra\":" + deep);
  expect_error(detail::deserialize_engine(with_header(engine_bytes(), text)).status(), ErrorCode::kInvalidModel,
               "engine header nests arrays/objects deeper than 64 levels");
}

TEST(EngineFileHostile, WrongFieldTypesAreInvalidFileErrors) {
  auto h = nlohmann::json::parse(header_of(engine_bytes()));
  for (const char* field : {"kiln_version", "graph_length", "target", "layers", "memory", "required_isa"}) {
    auto bad = h;
    bad[field] = nlohmann::json::array({nlohmann::json::object({{"x", 1}})});
    if (std::string(field) == "layers") bad[field] = 7;
    expect_error(detail::deserialize_engine(with_header(engine_bytes(), bad.dump())).status(), ErrorCode::kInvalidModel,
                 "rebuild");
  }
  expect_error(detail::deserialize_engine(with_header(engine_bytes(), "[1,2]")).status(), ErrorCode::kInvalidModel,
               "not a JSON object");
  expect_error(detail::deserialize_engine(with_header(engine_bytes(), "{\"a\":")).status(), ErrorCode::kInvalidModel,
               "not valid JSON");
}

TEST(EngineFileHostile, ProfilesAreValidatedBeforeUse) {
  auto h = nlohmann::json::parse(header_of(engine_bytes()));
  auto with_profile = [&](const nlohmann::json& in) {
    auto bad = h;
    bad["build"]["config"]["profiles"] = nlohmann::json::array(
        {{{"name", "p"}, {"inputs", {{"x", in}}}, {"memory", {{"min", 0}, {"opt", 0}, {"max", 0}}}}});
    return detail::deserialize_engine(with_header(engine_bytes(), bad.dump())).status();
  };
  expect_error(with_profile({{"min", {1, 4}}, {"opt", {1, 4}}, {"max", {1}}}), ErrorCode::kInvalidModel,
               "engine profile 'p' input 'x': min, opt and max have different ranks");
  expect_error(with_profile({{"min", {1, 4}}, {"opt", {2, 4}}, {"max", {1, 4}}}), ErrorCode::kInvalidModel,
               "is not 0 <= min <= opt <= max");
  // Found by fuzz_shapes: a float dim used to be converted to int64 (undefined behaviour).
  expect_error(with_profile({{"min", {1, 4}}, {"opt", {1, 3.8e35}}, {"max", {1, 4}}}), ErrorCode::kInvalidModel,
               "is not an integer");
  int64_t big = int64_t{1} << 40;
  expect_error(with_profile({{"min", {1, 4}}, {"opt", {1, 4}}, {"max", {big, big}}}), ErrorCode::kInvalidModel,
               "more elements than fit in 64 bits");
}

class EngineFileOnDisk : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_engine_hostile_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(EngineFileOnDisk, LoadsMappedAndRefusesNonRegularFiles) {
  std::string path = (dir_ / "m.kiln").string();
  std::ofstream(path, std::ios::binary) << engine_bytes();
  auto e = detail::load_engine_file(path);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_TRUE(Engine::load(path) != nullptr);

  std::string fifo = (dir_ / "fifo.kiln").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error(detail::load_engine_file(fifo).status(), ErrorCode::kInvalidArgument, "is a FIFO");
  expect_error(detail::load_engine_file(dir_.string()).status(), ErrorCode::kInvalidArgument, "is a directory");
  expect_error(detail::load_engine_file((dir_ / "none.kiln").string()).status(), ErrorCode::kNotFound,
               "does not exist");
}

TEST_F(EngineFileOnDisk, AHugeSparseFileFailsFastOnItsMagic) {
  std::string path = (dir_ / "sparse.kiln").string();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, off_t{4} << 30), 0);  // 4 GiB of holes: nothing on disk
  ::close(fd);
  auto t0 = std::chrono::steady_clock::now();
  expect_error(detail::load_engine_file(path).status(), ErrorCode::kInvalidModel, "bad magic");
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 1.0) << "the magic is checked before the file is read or mapped";
  // Right magic and version, lengths that disagree with the size: refused before mapping too.
  std::string head = engine_bytes().substr(0, 32);
  fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_EQ(::pwrite(fd, head.data(), 32, 0), 32);
  ::close(fd);
  expect_error(detail::load_engine_file(path).status(), ErrorCode::kInvalidModel, "truncated or has extra bytes");
}

}  // namespace
}  // namespace kiln
