#include "onnx/importer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "onnx/onnx.pb.h"
#include "ops/interpreter.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// A model computing y = (x + w) * x, x and y float32[2,3].
onnx::ModelProto small_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("kiln-test");
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto add_vi = [](onnx::ValueInfoProto* vi, const std::string& name) {
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(1);
    tt->mutable_shape()->add_dim()->set_dim_param("batch");
    tt->mutable_shape()->add_dim()->set_dim_value(3);
  };
  add_vi(g->add_input(), "x");
  add_vi(g->add_output(), "y");
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(1);
  w->add_dims(3);
  for (float v : {1.f, 2.f, 3.f}) w->add_float_data(v);
  auto* n1 = g->add_node();
  n1->set_name("add");
  n1->set_op_type("Add");
  n1->add_input("x");
  n1->add_input("w");
  n1->add_output("s");
  auto* n2 = g->add_node();
  n2->set_name("mul");
  n2->set_op_type("Mul");
  n2->add_input("s");
  n2->add_input("x");
  n2->add_output("y");
  return m;
}

Result<ir::Model> parse(const onnx::ModelProto& m, const std::string& dir = "") {
  return onnx_import::parse_model(m.SerializeAsString(), dir);
}

TEST(Importer, ImportsAndInfersSymbolicShapes) {
  auto m = parse(small_model());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->producer_name, "kiln-test");
  EXPECT_EQ(m->opset_imports.at(""), 13);
  const auto& t = m->graph->value_types.at("s");
  EXPECT_EQ(t.str(), "float32[batch,3]");
}

TEST(Importer, RunsThroughTheInterpreter) {
  auto m = parse(small_model());
  ASSERT_TRUE(m.ok());
  ops::Interpreter interp(m->graph);
  Tensor x = Tensor::from_vector<float>(DataType::kFloat32, {2, 3}, {1, 2, 3, 4, 5, 6});
  auto out = interp.run({{"x", ops::Value(x)}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const float* y = (*out)[0].tensor.data<float>();
  EXPECT_FLOAT_EQ(y[0], 2);   // (1+1)*1
  EXPECT_FLOAT_EQ(y[5], 54);  // (6+3)*6
}

TEST(Importer, RejectsTruncatedAndGarbageFiles) {
  std::string bytes = small_model().SerializeAsString();
  for (size_t cut : {size_t{1}, bytes.size() / 2, bytes.size() - 1}) {
    auto m = onnx_import::parse_model(bytes.substr(0, cut), "");
    EXPECT_FALSE(m.ok()) << "cut at " << cut;
  }
  auto g = onnx_import::parse_model("this is not a model at all", "");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("could not be parsed"), std::string::npos) << g.status().message();
}

TEST(Importer, NamesDanglingInputs) {
  auto m = small_model();
  m.mutable_graph()->mutable_node(1)->set_input(0, "nowhere");
  auto r = parse(m);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'nowhere'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("'mul'"), std::string::npos) << r.status().message();
}

TEST(Importer, DetectsCycles) {
  auto m = small_model();
  m.mutable_graph()->mutable_node(0)->set_input(0, "y");  // add reads mul's output
  auto r = parse(m);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cycle"), std::string::npos) << r.status().message();
}

TEST(Importer, RejectsUnknownDataType) {
  auto m = small_model();
  m.mutable_graph()->mutable_initializer(0)->set_data_type(99);
  auto r = parse(m);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(r.status().message().find("99"), std::string::npos);
}

TEST(Importer, RejectsRawDataOfWrongSize) {
  auto m = small_model();
  auto* w = m.mutable_graph()->mutable_initializer(0);
  w->clear_float_data();
  w->set_raw_data(std::string(7, '\0'));
  auto r = parse(m);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("raw_data holds 7 bytes"), std::string::npos) << r.status().message();
}

TEST(Importer, RejectsIrAndOpsetOutOfRange) {
  auto m = small_model();
  m.set_ir_version(99);
  EXPECT_EQ(parse(m).status().code(), ErrorCode::kUnsupported);
  m = small_model();
  m.mutable_opset_import(0)->set_version(40);
  auto r = parse(m);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("opset 40"), std::string::npos) << r.status().message();
}

TEST(Importer, ReadsExternalDataAndReportsMissingFiles) {
  fs::path dir = fs::temp_directory_path() / "kiln_ext_test";
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "weights.bin", std::ios::binary);
    float pad = 0, vals[3] = {10, 20, 30};
    f.write(reinterpret_cast<const char*>(&pad), 4);
    f.write(reinterpret_cast<const char*>(vals), 12);
  }
  auto m = small_model();
  auto* w = m.mutable_graph()->mutable_initializer(0);
  w->clear_float_data();
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  auto add_kv = [&](const char* k, const std::string& v) {
    auto* e = w->add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  add_kv("location", "weights.bin");
  add_kv("offset", "4");
  add_kv("length", "12");
  auto r = parse(m, dir.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FLOAT_EQ(r->graph->initializers.at("w").data<float>()[2], 30);

  w->mutable_external_data(0)->set_value("missing.bin");
  auto r2 = parse(m, dir.string());
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("missing.bin"), std::string::npos) << r2.status().message();

  w->mutable_external_data(0)->set_value("weights.bin");
  w->mutable_external_data(1)->set_value("8");  // offset 8 + 12 bytes runs past the 16-byte file
  auto r3 = parse(m, dir.string());
  ASSERT_FALSE(r3.ok());
  EXPECT_NE(r3.status().message().find("past the end"), std::string::npos) << r3.status().message();

  w->mutable_external_data(0)->set_value("../escape.bin");
  EXPECT_FALSE(parse(m, dir.string()).ok());
  fs::remove_all(dir);
}

TEST(Importer, ListsEveryUnsupportedNodeAtOnce) {
  auto m = small_model();
  m.mutable_graph()->mutable_node(0)->set_op_type("FancyOp");
  m.mutable_graph()->mutable_node(1)->set_op_type("OtherOp");
  auto r = parse(m);
  ASSERT_TRUE(r.ok()) << r.status().to_string();  // import succeeds; support is checked separately
  Status s = ops::check_supported(*r->graph);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.message().find("'add': FancyOp (domain ai.onnx, opset 13)"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'mul': OtherOp"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("examples/plugins"), std::string::npos) << s.message();
}

TEST(Importer, RejectsUndeclaredDomain) {
  auto m = small_model();
  m.mutable_graph()->mutable_node(0)->set_domain("com.example");
  auto r = parse(m);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("com.example"), std::string::npos);
}

TEST(Interpreter, ValidatesInputs) {
  auto m = parse(small_model());
  ASSERT_TRUE(m.ok());
  ops::Interpreter interp(m->graph);
  auto wrong_dtype = interp.run({{"x", ops::Value(Tensor(DataType::kInt64, {2, 3}))}});
  ASSERT_FALSE(wrong_dtype.ok());
  EXPECT_NE(wrong_dtype.status().message().find("expects dtype float32"), std::string::npos);
  auto wrong_shape = interp.run({{"x", ops::Value(Tensor(DataType::kFloat32, {2, 4}))}});
  ASSERT_FALSE(wrong_shape.ok());
  EXPECT_NE(wrong_shape.status().message().find("dim 1 must be 3"), std::string::npos)
      << wrong_shape.status().message();
  auto missing = interp.run({});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing input 'x'"), std::string::npos);
  auto extra = interp.run({{"x", ops::Value(Tensor(DataType::kFloat32, {1, 3}))}, {"z", ops::Value(Tensor())}});
  ASSERT_FALSE(extra.ok());
}

TEST(TensorProto, RoundTripsSubByteTypes) {
  Tensor t(DataType::kInt4, {5});
  for (int i = 0; i < 5; ++i) t.set_i64(i, i * 3 - 7);  // -7,-4,-1,2,5
  onnx::TensorProto p;
  onnx_import::tensor_to_proto(t, "t", &p);
  EXPECT_EQ(p.raw_data().size(), 3u);
  auto back = onnx_import::tensor_from_proto(p, "");
  ASSERT_TRUE(back.ok());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(back->get_i64(i), i * 3 - 7);
}

}  // namespace
}  // namespace kiln
