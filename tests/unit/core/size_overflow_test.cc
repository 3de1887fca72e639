// Element counts and byte sizes of hostile shapes (issue 15 item 2): every tensor is sized with
// overflow-checked arithmetic, so that a shape whose element count or byte size overflows 64 bits is
// refused before anything is allocated, never wrapped to a small buffer.
#include <gtest/gtest.h>

#include <stdexcept>

#include "core/tensor.h"
#include "kiln/kiln.h"
#include "onnx/onnx.pb.h"

namespace kiln {
namespace {

constexpr int64_t k2p62 = int64_t{1} << 62;

TEST(SizeOverflow, DimsNumelThrowsInsteadOfWrapping) {
  EXPECT_EQ(dims_numel({2, 3, 4}), 24);
  EXPECT_EQ(dims_numel({}), 1);
  // [2^62, 4] is 2^64 elements: wrapped, it was 0.
  EXPECT_THROW(dims_numel({k2p62, 4}), std::length_error);
  EXPECT_THROW(dims_numel({int64_t{1} << 32, int64_t{1} << 32}), std::length_error);
  EXPECT_EQ(dims_numel({INT64_MAX, 1}), INT64_MAX);
  // Empty whatever the other dims, as before.
  EXPECT_EQ(dims_numel({k2p62, 4, 0}), 0);
  EXPECT_EQ(dims_numel({0, INT64_MAX, INT64_MAX}), 0);
  try {
    dims_numel({k2p62, 4});
  } catch (const std::length_error& e) {
    EXPECT_NE(std::string(e.what()).find("[4611686018427387904,4]"), std::string::npos) << e.what();
  }
}

TEST(SizeOverflow, TensorRefusesShapesWhoseSizeOverflows) {
  // The element count overflows int64.
  EXPECT_THROW(Tensor(DataType::kFloat32, {k2p62, 4}), std::length_error);
  EXPECT_THROW(Tensor::uninitialized(DataType::kUInt8, {k2p62, 2}), std::length_error);
  // The count fits, the bytes do not: 2^62 doubles, 2^61 complex128 (16 bytes each).
  EXPECT_THROW(Tensor(DataType::kFloat64, {k2p62}), std::length_error);
  EXPECT_THROW(Tensor(DataType::kComplex128, {int64_t{1} << 61}), std::length_error);
  EXPECT_THROW(Tensor(DataType::kString, {k2p62}), std::length_error);
  // An alias over a small buffer with a wrapping shape (a memory plan's slot) is refused too.
  auto buffer = std::shared_ptr<uint8_t[]>(new uint8_t[64]);
  EXPECT_THROW(Tensor::alias(DataType::kFloat32, {k2p62, 4}, buffer, 0), std::length_error);
  EXPECT_EQ(Tensor::alias(DataType::kFloat32, {4, 4}, buffer, 0).nbytes(), 64u);
  EXPECT_EQ(Tensor(DataType::kFloat32, {k2p62, 0}).nbytes(), 0u);
}

TEST(SizeOverflow, HostTensorNumelIsChecked) {
  HostTensor t;
  t.dtype = kFloat32;
  t.shape = {3, 5};
  EXPECT_EQ(t.numel(), 15);
  t.shape = {k2p62, 4};
  try {
    t.numel();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("more elements than fit in 64 bits"), std::string::npos) << e.what();
  }
  t.shape = {2, -3};
  EXPECT_THROW(t.numel(), Error);
  // 2^62 elements fit; their 2^64 bytes do not.
  float one = 1;
  EXPECT_THROW(HostTensor::f32({int64_t{1} << 62}, &one), Error);
}

// Relu on x: float32[N, 4] (N dynamic).
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
    tt->mutable_shape()->add_dim()->set_dim_param("N");
    tt->mutable_shape()->add_dim()->set_dim_value(4);
  }
  auto* n = g->add_node();
  n->set_op_type("Relu");
  n->add_input("x");
  n->add_output("y");
  return m.SerializeAsString();
}

TEST(SizeOverflow, SetInputRefusesAShapeWhoseSizeWraps) {
  auto engine = Builder().build_from_memory(relu_onnx());
  auto ctx = engine->create_context();
  float data[4] = {1, -2, 3, -4};
  // [2^62, 4] float32 is 2^66 bytes, 0 when wrapped: it once matched nbytes = 0 and bound a tensor of
  // 2^64 elements over no memory.
  try {
    ctx->set_input("x", HostTensor::borrow(kFloat32, {k2p62, 4}, data, 0));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("overflows int64"), std::string::npos) << e.what();
  }
  // The context still works.
  ctx->set_input("x", HostTensor::borrow(kFloat32, {1, 4}, data, sizeof data));
  ctx->run();
  HostTensor y = ctx->output("y");
  ASSERT_EQ(y.numel(), 4);
  EXPECT_EQ(y.as<float>()[1], 0.0f);
  EXPECT_EQ(y.as<float>()[2], 3.0f);
}

}  // namespace
}  // namespace kiln
