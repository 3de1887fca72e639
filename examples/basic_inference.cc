// Builds an engine from an ONNX model with the public C++ API, saves and reloads it, runs it on
// ones, and prints each output's shape and first values.
//
//   kiln_example_basic model.onnx [engine.kiln]
#include <kiln/kiln.h>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s model.onnx [engine.kiln]\n", argv[0]);
    return 2;
  }
  const std::string engine_path = argc > 2 ? argv[2] : "example.kiln";
  try {
    kiln::BuilderConfig config;  // FP32, default passes
    kiln::Builder(config).build_from_file(argv[1])->save(engine_path);

    auto engine = kiln::Engine::load(engine_path);
    auto context = engine->create_context();  // one per thread
    std::vector<std::vector<float>> buffers;  // inputs stay alive until run() returns
    for (const auto& in : engine->inputs()) {
      std::vector<int64_t> shape;
      for (int64_t d : in.shape) shape.push_back(d < 0 ? 1 : d);  // dynamic dims: 1
      if (in.dtype != kiln::kFloat32) {
        std::fprintf(stderr, "this example feeds float32 inputs only; '%s' is not float32\n", in.name.c_str());
        return 2;
      }
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      buffers.emplace_back(static_cast<size_t>(n), 1.0f);
      context->set_input(in.name, kiln::HostTensor::f32(shape, buffers.back().data()));
    }
    context->run();
    for (const auto& name : context->output_names()) {
      kiln::HostTensor out = context->output(name);
      std::printf("%s: [", name.c_str());
      for (size_t i = 0; i < out.shape.size(); ++i)
        std::printf("%s%lld", i ? "," : "", static_cast<long long>(out.shape[i]));
      std::printf("]");
      if (out.dtype == kiln::kFloat32)
        for (int64_t i = 0; i < out.numel() && i < 4; ++i) std::printf(" %g", out.as<float>()[i]);
      std::printf("\n");
    }
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln error: %s\n", e.what());
    return 1;
  }
  return 0;
}
