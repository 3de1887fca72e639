// Marks the calls into a third-party kernel library (oneDNN) whose API makes small heap objects per
// call: its memory objects and argument maps (oneDNN 2.x's primitive execute builds an argument map of
// its own inside). kiln's own code allocates nothing in a steady-state run; the allocation-counting
// test (tests/noalloc) uses this scope to tell the library's small objects from kiln's allocations,
// and checks those stay few, small (no buffers: scratch comes from the layer's workspace) and the
// same from run to run.
#pragma once

namespace kiln {

// How deep this thread is inside library calls (0: in kiln's code).
int library_call_depth();

class LibraryCallScope {
 public:
  LibraryCallScope();
  ~LibraryCallScope();
  LibraryCallScope(const LibraryCallScope&) = delete;
  LibraryCallScope& operator=(const LibraryCallScope&) = delete;
};

}  // namespace kiln
