// kiln::compare_json (include/kiln/compare.h): the compare command parsed and run in-process, its
// report handed back instead of printed (the same option table as `kiln compare`, so flags, checks and
// messages cannot drift apart).
#include <algorithm>

#include "engine/engine_impl.h"
#include "kiln/compare.h"
#include "tools/commands.h"
#include "tools/compare_internal.h"

namespace kiln {

std::string compare_json(const std::vector<std::string>& args) {
  CLI::App app("kiln");
  int exit_code = 0;
  tools::compare::CompareResult result;
  tools::add_compare_command(app, exit_code, &result);
  std::vector<std::string> argv{"compare"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::reverse(argv.begin(), argv.end());  // CLI11 takes a vector last argument first
  try {
    app.parse(argv);
  } catch (const CLI::ParseError& e) {
    detail::throw_error(InvalidArgument("kiln compare: ", e.what()));
  } catch (...) {
    detail::rethrow_as_error("kiln compare");
  }
  if (!result.status.ok()) detail::throw_error(result.status);
  return result.report.dump();
}

}  // namespace kiln
