// Mutation fuzzer for the importer and the reference interpreter. It takes models from the ONNX
// backend suite, mutates them (raw bytes, or fields of the parsed protobuf: attributes, dims, dtypes,
// names, op types), and imports and runs each one. Any crash, sanitizer report or leak fails the
// run; every rejected model must come back as a Status with a message. Deterministic for a seed.
//
// usage: kiln_fuzz SUITE_DIR [--cases N] [--seed S] [--max-model-bytes B]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "onnx/importer.h"
#include "onnx/onnx.pb.h"
#include "ops/interpreter.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

struct Seed {
  std::string name;
  std::string bytes;
  std::vector<std::string> input_files;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<Seed> load_seeds(const std::string& suite, size_t max_bytes) {
  std::vector<Seed> seeds;
  std::vector<fs::path> dirs;
  for (const auto& sub : {"node", "pytorch-converted", "pytorch-operator", "simple"}) {
    fs::path d = fs::path(suite) / sub;
    if (!fs::exists(d)) continue;
    for (const auto& e : fs::directory_iterator(d)) dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  for (const auto& d : dirs) {
    fs::path m = d / "model.onnx";
    if (!fs::exists(m) || fs::file_size(m) > max_bytes) continue;
    Seed s{d.filename().string(), slurp(m), {}};
    for (int i = 0;; ++i) {
      fs::path in = d / "test_data_set_0" / ("input_" + std::to_string(i) + ".pb");
      if (!fs::exists(in)) break;
      s.input_files.push_back(in.string());
    }
    seeds.push_back(std::move(s));
  }
  return seeds;
}

int64_t interesting_int(std::mt19937_64& rng) {
  static const int64_t kValues[] = {
      -1,        0,         1,         2,        3, -2, 7, 64, 255, 65536, -1000000, int64_t{1} << 31, int64_t{1} << 40,
      INT64_MAX, INT64_MIN, INT32_MAX, INT32_MIN};
  if (rng() % 4 == 0) return static_cast<int64_t>(rng() % 100) - 50;
  return kValues[rng() % std::size(kValues)];
}

float interesting_float(std::mt19937_64& rng) {
  static const float kValues[] = {0.f, -1.f, 1.f, 0.5f, 1e30f, -1e30f, NAN, INFINITY, -INFINITY, 1e-40f};
  return kValues[rng() % std::size(kValues)];
}

void mutate_tensor(onnx::TensorProto* t, std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0:
      if (t->dims_size())
        t->set_dims(static_cast<int>(rng() % t->dims_size()), interesting_int(rng));
      else
        t->add_dims(interesting_int(rng));
      break;
    case 1: t->set_data_type(static_cast<int32_t>(rng() % 28)); break;
    case 2: t->add_dims(static_cast<int64_t>(rng() % 4)); break;
    default:
      if (t->has_raw_data() && !t->raw_data().empty()) {
        std::string r = t->raw_data();
        r[rng() % r.size()] = static_cast<char>(rng());
        t->set_raw_data(r);
      }
  }
}

void mutate_graph(onnx::GraphProto* g, std::mt19937_64& rng, int depth);

void mutate_node(onnx::NodeProto* n, onnx::GraphProto* g, std::mt19937_64& rng, int depth) {
  static const char* kOps[] = {"Add",    "Reshape", "Transpose", "Conv", "Gather", "Slice",   "Concat", "Loop",
                               "MatMul", "Softmax", "Resize",    "Pad",  "Split",  "Squeeze", "Cast",   "TopK"};
  switch (rng() % 8) {
    case 0:
    case 1:
    case 2: {
      if (n->attribute_size() == 0) break;
      auto* a = n->mutable_attribute(static_cast<int>(rng() % n->attribute_size()));
      if (a->has_i() || a->type() == onnx::AttributeProto::INT)
        a->set_i(interesting_int(rng));
      else if (a->ints_size())
        a->set_ints(static_cast<int>(rng() % a->ints_size()), interesting_int(rng));
      else if (a->has_f())
        a->set_f(interesting_float(rng));
      else if (a->has_t())
        mutate_tensor(a->mutable_t(), rng);
      else if (a->has_g() && depth < 3)
        mutate_graph(a->mutable_g(), rng, depth + 1);
      else if (a->has_s())
        a->set_s(rng() % 2 ? "" : "bogus");
      if (rng() % 5 == 0) a->add_ints(interesting_int(rng));
      break;
    }
    case 3: n->set_op_type(kOps[rng() % std::size(kOps)]); break;
    case 4:
      if (n->input_size())
        n->set_input(static_cast<int>(rng() % n->input_size()), rng() % 2         ? ""
                                                                : g->input_size() ? g->input(0).name()
                                                                                  : "x");
      break;
    case 5: n->add_input(g->input_size() ? g->input(static_cast<int>(rng() % g->input_size())).name() : ""); break;
    case 6:
      if (n->input_size()) n->mutable_input()->RemoveLast();
      break;
    default:
      if (n->output_size()) n->add_output("extra_out");
  }
}

void mutate_graph(onnx::GraphProto* g, std::mt19937_64& rng, int depth) {
  int r = static_cast<int>(rng() % 10);
  if (r < 6 && g->node_size()) {
    mutate_node(g->mutable_node(static_cast<int>(rng() % g->node_size())), g, rng, depth);
  } else if (r == 6 && g->initializer_size()) {
    mutate_tensor(g->mutable_initializer(static_cast<int>(rng() % g->initializer_size())), rng);
  } else if (r == 7 && g->input_size()) {
    auto* tt = g->mutable_input(static_cast<int>(rng() % g->input_size()))->mutable_type()->mutable_tensor_type();
    if (rng() % 2)
      tt->set_elem_type(static_cast<int32_t>(rng() % 28));
    else if (tt->shape().dim_size())
      tt->mutable_shape()
          ->mutable_dim(static_cast<int>(rng() % tt->shape().dim_size()))
          ->set_dim_value(interesting_int(rng));
  } else if (r == 8 && g->node_size() > 1) {
    g->mutable_node()->SwapElements(0, static_cast<int>(rng() % g->node_size()));
    if (rng() % 2) g->mutable_node()->RemoveLast();
  } else if (g->output_size()) {
    g->mutable_output(0)->set_name(g->node_size() ? g->node(0).input_size() ? g->node(0).input(0) : "y" : "y");
  }
}

std::string mutate(const std::string& bytes, std::mt19937_64& rng) {
  if (rng() % 3 == 0) {  // raw bytes
    std::string b = bytes;
    int k = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < k && !b.empty(); ++i) {
      switch (rng() % 4) {
        case 0: b[rng() % b.size()] ^= static_cast<char>(1u << (rng() % 8)); break;
        case 1: b[rng() % b.size()] = static_cast<char>(rng()); break;
        case 2: b.resize(rng() % b.size()); break;
        default: {
          size_t p = rng() % b.size();
          b.insert(p, b.substr(p, rng() % 16));
        }
      }
    }
    return b;
  }
  onnx::ModelProto m;
  if (!m.ParseFromString(bytes)) return bytes;
  int k = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < k; ++i) {
    if (rng() % 12 == 0 && m.opset_import_size())
      m.mutable_opset_import(0)->set_version(interesting_int(rng));
    else
      mutate_graph(m.mutable_graph(), rng, 0);
  }
  return m.SerializeAsString();
}

bool run_case(int64_t c, const Seed& s, const std::string& bytes, std::string* outcome) {
  auto model = onnx_import::parse_model(bytes, "");
  if (!model.ok()) {
    if (model.status().message().empty()) {
      std::fprintf(stderr, "case %lld (%s): error without a message\n", static_cast<long long>(c), s.name.c_str());
      return false;
    }
    *outcome = "rejected at import: " + std::string(error_code_name(model.status().code()));
    return true;
  }
  if (!ops::check_supported(*model->graph).ok()) {
    *outcome = "unsupported op";
    return true;
  }
  std::map<std::string, ops::Value> inputs;
  size_t k = 0;
  for (const auto& in : model->graph->inputs) {
    if (model->graph->initializers.count(in.name)) continue;
    if (k < s.input_files.size()) {
      auto v = onnx_import::read_value_pb(s.input_files[k], &in.type);
      if (v.ok()) inputs[in.name] = std::move(v).value();
    }
    ++k;
  }
  ops::Interpreter interp(model->graph);
  interp.set_deadline(std::chrono::steady_clock::now() + std::chrono::seconds(5));
  auto res = interp.run(inputs);
  if (!res.ok() && res.status().message().empty()) {
    std::fprintf(stderr, "case %lld (%s): run error without a message\n", static_cast<long long>(c), s.name.c_str());
    return false;
  }
  *outcome = res.ok() ? "ran" : "rejected at run: " + std::string(error_code_name(res.status().code()));
  if (!res.ok() && res.status().code() == ErrorCode::kInternal)
    std::printf("internal error (case %lld, %s): %s\n", static_cast<long long>(c), s.name.c_str(),
                res.status().message().substr(0, 200).c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: kiln_fuzz SUITE_DIR [--cases N] [--seed S] [--max-model-bytes B] [--fork 1] [--only N]\n");
    return 2;
  }
  std::string suite = argv[1];
  int64_t cases = 10000;
  uint64_t seed = 1;
  size_t max_bytes = 16384;
  bool fork_each = false;
  int64_t only = -1;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--cases")
      cases = std::atoll(argv[i + 1]);
    else if (k == "--seed")
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--max-model-bytes")
      max_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--fork")
      fork_each = std::string(argv[i + 1]) == "1";
    else if (k == "--only")
      only = std::atoll(argv[i + 1]);
  }
  std::vector<Seed> seeds = load_seeds(suite, max_bytes);
  if (seeds.empty()) {
    std::fprintf(stderr, "kiln_fuzz: no seed models under %s\n", suite.c_str());
    return 2;
  }
  std::mt19937_64 rng(seed);
  std::map<std::string, int64_t> outcomes;
  auto start = std::chrono::steady_clock::now();
  std::vector<std::string> crashes;
  for (int64_t c = 0; c < cases; ++c) {
    const Seed& s = seeds[rng() % seeds.size()];
    std::string bytes = mutate(s.bytes, rng);
    if (only >= 0 && c != only) continue;
    if (!fork_each) {
      std::string outcome;
      if (!run_case(c, s, bytes, &outcome)) return 1;
      ++outcomes[outcome];
      continue;
    }
    // Each case in a child: a crash or sanitizer report is recorded and the run goes on, so one
    // run lists every failing case (reproduce one with --only N).
    std::fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      if (crashes.size() >= 3) std::freopen("/dev/null", "w", stderr);  // full reports for the first few
      std::string outcome;
      bool ok = run_case(c, s, bytes, &outcome);
      std::exit(ok ? 0 : 1);  // exit (not _exit): LeakSanitizer checks at exit
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0))
      crashes.push_back("case " + std::to_string(c) + " (" + s.name + ")");
    else
      ++outcomes["completed in a child"];
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("kiln_fuzz: %lld cases from %zu seed models in %.1f s, seed %llu, %zu crashed\n",
              static_cast<long long>(cases), seeds.size(), secs, static_cast<unsigned long long>(seed), crashes.size());
  for (const auto& c2 : crashes) std::printf("  CRASH %s\n", c2.c_str());
  for (const auto& [k2, v] : outcomes) std::printf("  %-45s %lld\n", k2.c_str(), static_cast<long long>(v));
  return crashes.empty() ? 0 : 1;
}
