#include "onnx/raw_data_split.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "onnx/importer.h"
#include "onnx/onnx.pb.h"

namespace kiln {
namespace {

// y = x + w1 + w2 with w1 large (raw_data, detached), w2 small (raw_data, kept), plus a graph-level
// field after the initializers so that rewriting must keep every other field.
onnx::ModelProto model_with_weights(int64_t n) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  m.set_producer_name("kiln-test");
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto vi = [&](onnx::ValueInfoProto* v, const std::string& name) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(1);
    tt->mutable_shape()->add_dim()->set_dim_value(n);
  };
  vi(g->add_input(), "x");
  vi(g->add_output(), "y");
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const char* name : {"w1", "w2"}) {
    auto* w = g->add_initializer();
    w->set_name(name);
    w->set_data_type(1);
    int64_t len = name[1] == '1' ? n : 1;
    w->add_dims(len);
    std::string raw(static_cast<size_t>(len) * 4, '\0');
    for (int64_t i = 0; i < len; ++i) {
      float v = u(rng);
      std::memcpy(raw.data() + i * 4, &v, 4);
    }
    w->set_raw_data(raw);
  }
  auto* a = g->add_node();
  a->set_op_type("Add"), a->add_input("x"), a->add_input("w1"), a->add_output("s");
  auto* b = g->add_node();
  b->set_op_type("Add"), b->add_input("s"), b->add_input("w2"), b->add_output("y");
  g->set_doc_string("after the initializers");
  return m;
}

TEST(DetachRawData, ReplacesLargeRawDataByReferencesIntoTheBytes) {
  auto m = model_with_weights(5000);
  std::string bytes = m.SerializeAsString();
  auto out = onnx_import::detach_raw_data(bytes, 4096);
  ASSERT_TRUE(out.has_value());
  EXPECT_LT(out->size(), 1000u);  // the 20 kB of w1 are gone
  onnx::ModelProto r;
  ASSERT_TRUE(r.ParseFromString(*out));
  EXPECT_EQ(r.graph().doc_string(), "after the initializers");
  EXPECT_EQ(r.producer_name(), "kiln-test");
  ASSERT_EQ(r.graph().initializer_size(), 2);
  const auto& w1 = r.graph().initializer(0);
  EXPECT_FALSE(w1.has_raw_data());
  EXPECT_EQ(w1.data_location(), onnx::TensorProto::EXTERNAL);
  int64_t offset = -1, length = -1;
  for (const auto& kv : w1.external_data()) {
    if (kv.key() == "offset") offset = std::stoll(kv.value());
    if (kv.key() == "length") length = std::stoll(kv.value());
  }
  ASSERT_EQ(length, 20000);
  EXPECT_EQ(bytes.substr(static_cast<size_t>(offset), 20000), m.graph().initializer(0).raw_data());
  EXPECT_TRUE(r.graph().initializer(1).has_raw_data());  // 4 bytes: below the threshold, kept
}

TEST(DetachRawData, ImportGivesTheSameTensors) {
  auto m = model_with_weights(3001);  // odd sizes
  std::string bytes = m.SerializeAsString();
  ASSERT_TRUE(onnx_import::detach_raw_data(bytes).has_value());
  auto r = onnx_import::parse_model(bytes, "");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (int i = 0; i < 2; ++i) {
    const auto& p = m.graph().initializer(i);
    const Tensor& t = r->graph->initializers.at(p.name());
    ASSERT_EQ(t.nbytes(), p.raw_data().size());
    EXPECT_EQ(std::memcmp(t.raw(), p.raw_data().data(), t.nbytes()), 0) << p.name();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  }
}

TEST(DetachRawData, LeavesOtherInputsToProtobuf) {
  auto m = model_with_weights(100);  // nothing large enough
  EXPECT_FALSE(onnx_import::detach_raw_data(m.SerializeAsString()).has_value());
  auto big = model_with_weights(5000);
  std::string bytes = big.SerializeAsString();
  for (size_t cut : {size_t{1}, size_t{17}, bytes.size() / 2, bytes.size() - 3})  // truncated
    EXPECT_FALSE(onnx_import::detach_raw_data(std::string_view(bytes).substr(0, cut)).has_value()) << cut;
  EXPECT_FALSE(onnx_import::detach_raw_data("\x0b\x0c garbage").has_value());  // group wire types
  // A tensor that already has external data (or a data_location) is not touched.
  big.mutable_graph()->mutable_initializer(0)->set_data_location(onnx::TensorProto::DEFAULT);
  EXPECT_FALSE(onnx_import::detach_raw_data(big.SerializeAsString()).has_value());
  // The detached location is refused if a model names it itself (it starts with "..": outside the folder).
  auto fake = model_with_weights(4);
  auto* w = fake.mutable_graph()->mutable_initializer(0);
  w->clear_raw_data();
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* kv = w->add_external_data();
  kv->set_key("location");
  kv->set_value(std::string(onnx_import::kDetachedLocation));
  auto r = onnx_import::parse_model(fake.SerializeAsString(), "/tmp");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("resolves outside the model's folder"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace kiln
