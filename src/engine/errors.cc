// Exceptions at the public boundary: whatever escapes kiln's Status-returning code (an allocation
// that fails on a hostile size, a filesystem or JSON library throwing) becomes one of kiln's error
// categories with a message, never an abort (issue 15, item 5).
#include <filesystem>
#include <new>
#include <stdexcept>

#include "engine/engine_impl.h"

namespace kiln::detail {

Status status_of_exception(std::exception_ptr p, const std::string& what) {
  const std::string where = what.empty() ? std::string() : what + ": ";
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    return status_of(e);
  } catch (const std::bad_alloc&) {
    return OutOfRange(where, "out of memory (a size in the model, an input or a flag is larger than this machine ",
                      "can hold)");
  } catch (const std::length_error& e) {
    return OutOfRange(where, "a size is too large (", e.what(), ")");
  } catch (const std::filesystem::filesystem_error& e) {
    return IOError(where, e.what());
  } catch (const nlohmann::json::exception& e) {
    return InvalidModel(where, "malformed JSON: ", e.what());
  } catch (const std::system_error& e) {
    return IOError(where, "system error: ", e.what());
  } catch (const std::exception& e) {
    return Internal(where, "unexpected exception: ", e.what());
  } catch (...) {
    return Internal(where, "unexpected exception of unknown type");
  }
}

void rethrow_as_error(const std::string& what) {
  std::exception_ptr p = std::current_exception();
  try {
    std::rethrow_exception(p);
  } catch (const Error&) {
    throw;
  } catch (...) {
  }
  throw_error(status_of_exception(p, what));
}

}  // namespace kiln::detail
