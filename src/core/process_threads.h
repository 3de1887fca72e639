// kiln::set_threads is process-wide, but OpenMP keeps its thread count per calling thread (a thread
// started later begins at the default): the public entry points that run kernels (building, creating
// a context, run()) call sync_process_threads() first, so every thread uses the count last set by any
// thread (Python threads, a caller's pool of contexts). Cheap when nothing changed: one atomic load.
#pragma once

namespace kiln {

// Applies the count of the last set_num_threads() of any thread to the calling thread, if it has not yet.
void sync_process_threads();

}  // namespace kiln
