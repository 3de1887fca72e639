#include "core/library_scope.h"

namespace kiln {

namespace {
thread_local int t_depth = 0;
}

int library_call_depth() { return t_depth; }
LibraryCallScope::LibraryCallScope() { ++t_depth; }
LibraryCallScope::~LibraryCallScope() { --t_depth; }

}  // namespace kiln
