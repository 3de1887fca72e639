// The importer on hostile files: external data outside the model's folder (symlinks, `..`), that is
// a directory or a FIFO, and its opt-in; initializers whose sizes overflow or exceed the limit;
// sparse initializers whose indices do not match their values or dims; input .pb external data.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../expect_status.h"
#include "core/checked_size.h"
#include "onnx/importer.h"
#include "onnx/onnx.pb.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// y = Identity(w), w float32[3] an initializer.
onnx::ModelProto identity_of_initializer() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto* y = g->add_output();
  y->set_name("y");
  y->mutable_type()->mutable_tensor_type()->set_elem_type(1);
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(1);
  w->add_dims(3);
  for (float v : {1.f, 2.f, 3.f}) w->add_float_data(v);
  auto* n = g->add_node();
  n->set_op_type("Identity");
  n->add_input("w");
  n->add_output("y");
  return m;
}

void make_external(onnx::TensorProto* w, const std::string& location) {
  w->clear_float_data();
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* e = w->add_external_data();
  e->set_key("location");
  e->set_value(location);
}

using kiln::testing::expect_error;

class ImporterFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("kiln_importer_files_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "model" / "sub");
    fs::create_directories(root_ / "outside");
    float v[3] = {7, 8, 9};
    std::ofstream(root_ / "outside" / "secret.bin", std::ios::binary).write(reinterpret_cast<char*>(v), 12);
    std::ofstream(root_ / "model" / "w.bin", std::ios::binary).write(reinterpret_cast<char*>(v), 12);
    fs::create_symlink("../outside/secret.bin", root_ / "model" / "link_file");
    fs::create_symlink("../outside", root_ / "model" / "link_dir");
    ASSERT_EQ(::mkfifo((root_ / "model" / "fifo").c_str(), 0600), 0);
  }
  void TearDown() override { fs::remove_all(root_); }
  Result<ir::Model> import_with_location(const std::string& loc, bool allow = false) {
    auto m = identity_of_initializer();
    make_external(m.mutable_graph()->mutable_initializer(0), loc);
    onnx_import::ImportOptions opts;
    opts.allow_external_data_outside = allow;
    return onnx_import::parse_model(m.SerializeAsString(), (root_ / "model").string(), opts);
  }
  fs::path root_;
};

TEST_F(ImporterFiles, ExternalDataStaysInsideTheModelFolder) {
  auto ok = import_with_location("sub/../w.bin");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->graph->initializers.at("w").data<float>()[2], 9);
  for (const char* loc : {"link_file", "link_dir/secret.bin", "../outside/secret.bin", "/etc/passwd"})
    expect_error(import_with_location(loc).status(), ErrorCode::kInvalidModel, "resolves outside the model's folder");
  auto allowed = import_with_location("link_dir/secret.bin", /*allow=*/true);
  ASSERT_TRUE(allowed.ok()) << allowed.status().to_string();
  EXPECT_EQ(allowed->graph->initializers.at("w").data<float>()[0], 7);
}

TEST_F(ImporterFiles, ExternalDataMustBeARegularFile) {
  expect_error(import_with_location("sub").status(), ErrorCode::kInvalidModel,
               "external data 'sub' of initializer 'w' is a directory");
  expect_error(import_with_location("fifo").status(), ErrorCode::kInvalidModel,
               "external data 'fifo' of initializer 'w' is a FIFO");
}

TEST_F(ImporterFiles, InputPbExternalDataIsConfinedToo) {
  onnx::TensorProto t;
  t.set_name("x");
  t.set_data_type(1);
  t.add_dims(3);
  make_external(&t, "link_file");
  std::string pb = (root_ / "model" / "input_0.pb").string();
  std::ofstream(pb, std::ios::binary) << t.SerializeAsString();
  expect_error(onnx_import::read_value_pb(pb).status(), ErrorCode::kInvalidModel, "resolves outside");
  onnx_import::ImportOptions opts;
  opts.allow_external_data_outside = true;
  auto v = onnx_import::read_value_pb(pb, nullptr, opts);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  // An input given as a FIFO is a named error, not a hang.
  expect_error(onnx_import::read_value_pb((root_ / "model" / "fifo").string()).status(), ErrorCode::kInvalidArgument,
               "is a FIFO");
}

TEST(ImporterSizes, InitializerDimsAreOverflowCheckedAndBounded) {
  auto m = identity_of_initializer();
  auto* w = m.mutable_graph()->mutable_initializer(0);
  w->clear_dims();
  for (int64_t d : {int64_t{1} << 32, int64_t{1} << 32}) w->add_dims(d);
  expect_error(onnx_import::parse_model(m.SerializeAsString(), "").status(), ErrorCode::kInvalidModel,
               "more elements than fit in 64 bits");
  w->clear_dims();
  w->add_dims(int64_t{1} << 33);  // 32 GiB of float32 declared by a tensor holding 3 values
  expect_error(onnx_import::parse_model(m.SerializeAsString(), "").status(), ErrorCode::kInvalidModel,
               "would take 34359738368 bytes");
}

// values [n] float, indices int64 of `idims`, dense shape `dims`.
onnx::ModelProto sparse_model(int64_t n, const std::vector<int64_t>& idims, const std::vector<int64_t>& indices,
                              const std::vector<int64_t>& dims) {
  auto m = identity_of_initializer();
  auto* g = m.mutable_graph();
  g->clear_initializer();
  auto* sp = g->add_sparse_initializer();
  auto* v = sp->mutable_values();
  v->set_name("w");
  v->set_data_type(1);
  v->add_dims(n);
  for (int64_t i = 0; i < n; ++i) v->add_float_data(static_cast<float>(i + 1));
  auto* ix = sp->mutable_indices();
  ix->set_name("w_indices");
  ix->set_data_type(7);
  for (int64_t d : idims) ix->add_dims(d);
  for (int64_t i : indices) ix->add_int64_data(i);
  for (int64_t d : dims) sp->add_dims(d);
  return m;
}

TEST(ImporterSizes, SparseIndicesAreValidatedAgainstValuesAndDims) {
  auto ok = onnx_import::parse_model(sparse_model(2, {2}, {1, 5}, {2, 3}).SerializeAsString(), "");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->graph->initializers.at("w").data<float>()[5], 2);
  auto coo = onnx_import::parse_model(sparse_model(2, {2, 2}, {0, 1, 1, 2}, {2, 3}).SerializeAsString(), "");
  ASSERT_TRUE(coo.ok()) << coo.status().to_string();
  EXPECT_EQ(coo->graph->initializers.at("w").data<float>()[5], 2);
  // Fewer indices than values: the values' count used to be read past the indices' end.
  expect_error(onnx_import::parse_model(sparse_model(3, {1}, {0}, {2, 3}).SerializeAsString(), "").status(),
               ErrorCode::kInvalidModel, "indices of shape [1] do not match 3 values");
  expect_error(
      onnx_import::parse_model(sparse_model(2, {2, 3}, {0, 0, 0, 1, 1, 1}, {2, 3}).SerializeAsString(), "").status(),
      ErrorCode::kInvalidModel, "expected [2] or [2,2]");
  // A 2-D coordinate out of its axis' range (that still lands inside the flat range: 0*3+4 = 4).
  expect_error(onnx_import::parse_model(sparse_model(1, {1, 2}, {0, 4}, {2, 3}).SerializeAsString(), "").status(),
               ErrorCode::kInvalidModel, "coordinate 4 on axis 1, outside [0, 3)");
  expect_error(onnx_import::parse_model(sparse_model(1, {1}, {6}, {2, 3}).SerializeAsString(), "").status(),
               ErrorCode::kInvalidModel, "outside the 6 elements");
  expect_error(
      onnx_import::parse_model(sparse_model(1, {1}, {0}, {int64_t{1} << 40, 1 << 20}).SerializeAsString(), "").status(),
      ErrorCode::kInvalidModel, "would take");
}

}  // namespace
}  // namespace kiln
