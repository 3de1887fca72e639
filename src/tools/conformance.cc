// kiln conformance: runs ONNX's backend test suite (node tests and model tests) through the
// reference interpreter and reports pass / fail / unsupported per test and per op. Each test runs
// in a child process so that one crash or hang cannot take the whole run down.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "engine/engine_impl.h"
#include "onnx/importer.h"
#include "ops/interpreter.h"
#include "tools/commands.h"

namespace kiln::tools {

namespace fs = std::filesystem;

namespace {

struct TestCase {
  std::string name;                        // "node/test_abs"
  std::string model;                       // path to model.onnx
  std::vector<std::string> data_dirs;      // test_data_set_* (empty for light models)
  std::vector<std::string> light_outputs;  // light models: output_*.pb next to the model
};

struct Outcome {
  std::string status;  // "pass", "fail", "unsupported"
  std::string message;
  std::vector<std::string> ops;
  double seconds = 0;
};

std::vector<TestCase> discover(const std::string& root) {
  std::vector<TestCase> tests;
  std::error_code ec;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::recursive_directory_iterator(root, ec)) {
    if (e.is_regular_file() && e.path().filename() == "model.onnx") dirs.push_back(e.path().parent_path());
    if (e.is_regular_file() && e.path().extension() == ".onnx" && e.path().filename() != "model.onnx") {
      TestCase t;
      std::string stem = e.path().stem().string();
      t.name = fs::relative(e.path().parent_path(), root).string() + "/" + stem;
      t.model = e.path().string();
      for (int i = 0;; ++i) {
        fs::path out = e.path().parent_path() / (stem + "_output_" + std::to_string(i) + ".pb");
        if (!fs::exists(out)) break;
        t.light_outputs.push_back(out.string());
      }
      if (!t.light_outputs.empty()) tests.push_back(t);
    }
  }
  for (const auto& d : dirs) {
    TestCase t;
    t.name = fs::relative(d, root).string();
    if (t.name == ".") t.name = d.filename().string();
    t.model = (d / "model.onnx").string();
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0)
        t.data_dirs.push_back(e.path().string());
    std::sort(t.data_dirs.begin(), t.data_dirs.end());
    if (!t.data_dirs.empty()) tests.push_back(t);
  }
  std::sort(tests.begin(), tests.end(), [](const TestCase& a, const TestCase& b) { return a.name < b.name; });
  return tests;
}

void collect_ops(const ir::Graph& g, std::set<std::string>& ops) {
  for (const auto& n : g.nodes) {
    ops.insert(n.domain.empty() ? n.op_type : n.domain + "." + n.op_type);
    for (const auto& [k, a] : n.attrs) {
      if (a.g) collect_ops(*a.g, ops);
      for (const auto& sg : a.graphs) collect_ops(*sg, ops);
    }
  }
}

// Inferred static types must agree with what actually came out.
Status check_inferred(const ir::ValueInfo& decl, const ops::Value& got) {
  if (!decl.type.is_tensor() || !got.is_tensor()) return Status::Ok();
  const SymShape& s = decl.type.shape;
  if (decl.type.elem != DataType::kUndefined && decl.type.elem != got.tensor.dtype())
    return InvalidModel("output '", decl.name, "': inference said ", decl.type.str(), ", run produced ",
                        got.tensor.describe());
  if (!s.rank_known) return Status::Ok();
  bool bad = s.rank() != got.tensor.shape().size();
  for (size_t i = 0; !bad && i < s.rank(); ++i) bad = s.dims[i].known() && s.dims[i].value != got.tensor.shape()[i];
  if (bad)
    return InvalidModel("output '", decl.name, "': inference said ", decl.type.str(), ", run produced ",
                        got.tensor.describe());
  return Status::Ok();
}

// Engine mode: the model goes through kiln build (all passes), the engine file format (serialize +
// load) and an ExecutionContext; outputs must match the reference interpreter and the expected data.
struct EngineCheck {
  bool enabled = false;
  std::vector<std::string> tactics;  // BuilderConfig::tactics (--tactics); empty: all
  Tolerance vs_reference{1e-4, 1e-5};
};

Outcome run_test(const TestCase& tc, const Tolerance& tol, const EngineCheck& engine_check) {
  Outcome out;
  auto classify = [&](const Status& s) {
    out.status = s.code() == ErrorCode::kUnsupported ? "unsupported" : "fail";
    out.message = s.to_string();
    return out;
  };
  auto model = onnx_import::load_model(tc.model);
  if (!model.ok()) return classify(model.status());
  std::set<std::string> ops;
  collect_ops(*model->graph, ops);
  out.ops.assign(ops.begin(), ops.end());
  Status sup = ops::check_supported(*model->graph);
  if (!sup.ok()) return classify(sup);
  const ir::Graph& g = *model->graph;
  std::vector<const ir::ValueInfo*> all_inputs, free_inputs;
  for (const auto& in : g.inputs) {
    all_inputs.push_back(&in);
    if (!g.initializers.count(in.name)) free_inputs.push_back(&in);
  }
  std::shared_ptr<detail::EngineImpl> engine;
  if (engine_check.enabled) {
    auto m2 = onnx_import::load_model(tc.model);
    if (!m2.ok()) return classify(m2.status());
    BuilderConfig cfg;
    cfg.tactics = engine_check.tactics;
    cfg.warn = [](const std::string&) {};  // reference layers are not what conformance checks
    auto built = detail::build_engine(std::move(m2).value(), cfg);
    if (!built.ok()) return classify(built.status().with_context("kiln build: "));
    auto bytes = detail::serialize_engine(*built.value());
    if (!bytes.ok()) return classify(bytes.status().with_context("engine save: "));
    auto loaded = detail::deserialize_engine(bytes.value());
    if (!loaded.ok()) return classify(loaded.status().with_context("engine load: "));
    engine = loaded.value();
  }
  std::vector<std::string> sets = tc.data_dirs;
  if (sets.empty()) sets.push_back("");  // light model
  for (const auto& dir : sets) {
    std::map<std::string, ops::Value> inputs;
    std::vector<ops::Value> expected;
    if (!dir.empty()) {
      std::vector<std::string> in_files, out_files;
      for (int i = 0;; ++i) {
        std::string f = dir + "/input_" + std::to_string(i) + ".pb";
        if (!fs::exists(f)) break;
        in_files.push_back(f);
      }
      for (int i = 0;; ++i) {
        std::string f = dir + "/output_" + std::to_string(i) + ".pb";
        if (!fs::exists(f)) break;
        out_files.push_back(f);
      }
      const auto& targets = in_files.size() == all_inputs.size() ? all_inputs : free_inputs;
      if (in_files.size() > targets.size())
        return classify(InvalidModel("test has ", in_files.size(), " inputs but the model takes ", targets.size()));
      for (size_t i = 0; i < in_files.size(); ++i) {
        auto v = onnx_import::read_value_pb(in_files[i], &targets[i]->type);
        if (!v.ok()) return classify(v.status());
        inputs[targets[i]->name] = std::move(v).value();
      }
      for (size_t i = 0; i < out_files.size() && i < g.outputs.size(); ++i) {
        auto v = onnx_import::read_value_pb(out_files[i], &g.outputs[i].type);
        if (!v.ok()) return classify(v.status());
        expected.push_back(std::move(v).value());
      }
    } else {
      for (const auto& f : tc.light_outputs) {
        auto v = onnx_import::read_value_pb(f, nullptr);
        if (!v.ok()) return classify(v.status());
        expected.push_back(std::move(v).value());
      }
      Status st = fill_random_inputs(g, 0, {}, inputs);
      if (!st.ok()) return classify(st);
    }
    ops::Interpreter interp(model->graph);
    auto res = interp.run(inputs);
    if (!res.ok()) return classify(res.status());
    if (engine) {
      auto eng = detail::run_engine(*engine, inputs);
      if (!eng.ok()) return classify(eng.status().with_context("engine run: "));
      if (eng->size() != res->size())
        return classify(Internal("engine gave ", eng->size(), " outputs, reference ", res->size()));
      for (size_t i = 0; i < res->size(); ++i) {
        Status st = compare_value(g.outputs[i].name, (*eng)[i], (*res)[i], engine_check.vs_reference);
        if (!st.ok()) return classify(st.with_context("engine vs reference interpreter: "));
      }
      res = std::move(eng);
    }
    if (expected.size() > res->size())
      return classify(InvalidModel("model has ", res->size(), " outputs, test expects ", expected.size()));
    for (size_t i = 0; i < expected.size(); ++i) {
      Status st = compare_value(g.outputs[i].name, (*res)[i], expected[i], tol);
      if (!st.ok()) return classify(st);
      st = check_inferred(g.outputs[i], (*res)[i]);
      if (!st.ok()) return classify(st);
    }
  }
  out.status = "pass";
  return out;
}

// Runs one test in a child process; a crash or timeout becomes a "fail" with the reason.
Outcome run_isolated(const TestCase& tc, const Tolerance& tol, const EngineCheck& ec, int timeout_s) {
  int fds[2];
  if (pipe(fds) != 0) return run_test(tc, tol, ec);
  auto start = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    alarm(static_cast<unsigned>(timeout_s));
    Outcome o = run_test(tc, tol, ec);
    nlohmann::json j = {{"status", o.status}, {"message", o.message}, {"ops", o.ops}};
    std::string s = j.dump();
    size_t off = 0;
    while (off < s.size()) {
      ssize_t w = write(fds[1], s.data() + off, s.size() - off);
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string buf;
  char tmp[65536];
  ssize_t r;
  while ((r = read(fds[0], tmp, sizeof tmp)) > 0) buf.append(tmp, static_cast<size_t>(r));
  close(fds[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  Outcome o;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFSIGNALED(wstatus)) {
    int sig = WTERMSIG(wstatus);
    o.status = "fail";
    o.message = sig == SIGALRM ? "timed out after " + std::to_string(timeout_s) + " s"
                               : std::string("crashed with signal ") + strsignal(sig);
    return o;
  }
  try {
    auto j = nlohmann::json::parse(buf);
    o.status = j["status"];
    o.message = j["message"];
    o.ops = j["ops"].get<std::vector<std::string>>();
  } catch (...) {
    o.status = "fail";
    o.message = "test process exited without a result";
  }
  return o;
}

struct ConformanceOptions {
  std::string dir;
  std::string filter;
  std::string json_path;
  std::string expect_path;
  std::string write_expect_path;
  double rtol = 1e-3, atol = 1e-7;
  int timeout_s = 120;
  bool quiet = false;
  bool engine = false;
  std::vector<std::string> tactics;
};

int run_conformance(const ConformanceOptions& o) {
  if (!fs::is_directory(o.dir)) return report_error(NotFound("'", o.dir, "' is not a directory"));
  std::vector<TestCase> tests = discover(o.dir);
  if (!o.filter.empty()) {
    std::regex re(o.filter);
    std::erase_if(tests, [&](const TestCase& t) { return !std::regex_search(t.name, re); });
  }
  Tolerance tol{o.rtol, o.atol};
  std::map<std::string, std::array<int, 3>> per_op;  // pass, fail, unsupported
  std::map<std::string, std::array<int, 3>> per_suite;
  nlohmann::json jtests = nlohmann::json::array();
  std::set<std::string> passed;
  int counts[3] = {0, 0, 0};
  for (const auto& tc : tests) {
    EngineCheck ec;
    ec.enabled = o.engine;
    ec.tactics = o.tactics;
    Outcome r = run_isolated(tc, tol, ec, o.timeout_s);
    int k = r.status == "pass" ? 0 : r.status == "fail" ? 1 : 2;
    ++counts[k];
    std::string suite = tc.name.substr(0, tc.name.find('/'));
    ++per_suite[suite][static_cast<size_t>(k)];
    for (const auto& op : r.ops) ++per_op[op][static_cast<size_t>(k)];
    if (k == 0) passed.insert(tc.name);
    std::string first_line = r.message.substr(0, r.message.find('\n'));
    if (!o.quiet) std::printf("%-12s %-70s %s\n", r.status.c_str(), tc.name.c_str(), first_line.substr(0, 300).c_str());
    jtests.push_back(
        {{"name", tc.name}, {"status", r.status}, {"message", r.message}, {"ops", r.ops}, {"seconds", r.seconds}});
  }
  std::printf("\nper op (tests using the op: pass / fail / unsupported)\n");
  nlohmann::json jops = nlohmann::json::object();
  for (const auto& [op, c] : per_op) {
    std::printf("  %-40s %5d %5d %5d\n", op.c_str(), c[0], c[1], c[2]);
    jops[op] = {{"pass", c[0]}, {"fail", c[1]}, {"unsupported", c[2]}};
  }
  std::printf("\nper suite: pass / fail / unsupported / total\n");
  nlohmann::json jsuites = nlohmann::json::object();
  for (const auto& [s, c] : per_suite) {
    std::printf("  %-20s %5d %5d %5d %5d  (%.1f%% pass)\n", s.c_str(), c[0], c[1], c[2], c[0] + c[1] + c[2],
                100.0 * c[0] / std::max(1, c[0] + c[1] + c[2]));
    jsuites[s] = {{"pass", c[0]}, {"fail", c[1]}, {"unsupported", c[2]}};
  }
  int total = counts[0] + counts[1] + counts[2];
  std::printf("\nTOTAL: %d pass, %d fail, %d unsupported of %d (%.1f%% pass)\n", counts[0], counts[1], counts[2], total,
              100.0 * counts[0] / std::max(1, total));
  if (!o.json_path.empty()) {
    nlohmann::json j = {
        {"summary", {{"pass", counts[0]}, {"fail", counts[1]}, {"unsupported", counts[2]}, {"total", total}}},
        {"suites", jsuites},
        {"ops", jops},
        {"tests", jtests},
        {"rtol", o.rtol},
        {"atol", o.atol}};
    std::ofstream(o.json_path) << j.dump(1) << "\n";
  }
  if (!o.write_expect_path.empty()) {
    std::ofstream f(o.write_expect_path);
    f << "# Tests expected to pass (kiln conformance --write-expect); a regression fails the test suite.\n";
    for (const auto& n : passed) f << n << "\n";
  }
  int rc = kExitOk;
  if (!o.expect_path.empty()) {
    std::ifstream f(o.expect_path);
    if (!f) return report_error(NotFound("cannot open expectation file '", o.expect_path, "'"));
    std::string line;
    int regressions = 0, checked = 0;
    std::set<std::string> known;
    for (const auto& t : tests) known.insert(t.name);
    while (std::getline(f, line)) {
      if (line.empty() || line[0] == '#' || !known.count(line)) continue;
      ++checked;
      if (!passed.count(line)) {
        ++regressions;
        std::printf("REGRESSION: %s is expected to pass\n", line.c_str());
      }
    }
    std::printf("expectations: %d checked, %d regressions\n", checked, regressions);
    if (regressions) rc = kExitMismatch;
  }
  return rc;
}

}  // namespace

void add_conformance_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ConformanceOptions>();
  CLI::App* cmd = app.add_subcommand("conformance", "Run ONNX's backend test suite through the reference interpreter");
  cmd->add_option("dir", o->dir, "unpacked suite (or any folder of ONNX tests)")->required();
  cmd->add_option("--filter", o->filter, "only tests whose name matches this regex");
  cmd->add_option("--json", o->json_path, "write results as JSON");
  cmd->add_option("--expect", o->expect_path, "fail if any test listed in this file does not pass");
  cmd->add_option("--write-expect", o->write_expect_path, "write the names of passing tests");
  cmd->add_option("--rtol", o->rtol, "relative tolerance (ONNX's runner: 1e-3)");
  cmd->add_option("--atol", o->atol, "absolute tolerance (ONNX's runner: 1e-7)");
  cmd->add_option("--timeout", o->timeout_s, "seconds per test");
  cmd->add_flag("--quiet", o->quiet, "only print totals");
  cmd->add_flag("--engine", o->engine,
                "run each model through kiln build (all passes), the engine file and an ExecutionContext; outputs must "
                "match the reference interpreter (rtol 1e-4, atol 1e-5) and the expected data");
  cmd->add_option("--tactics", o->tactics,
                  "with --engine: only these kernels (as kiln build --tactics; 'reference': reference kernels only)")
      ->delimiter(',');
  cmd->callback([o, &exit_code]() { exit_code = run_conformance(*o); });
}

}  // namespace kiln::tools
