#include "train/run_main.h"

#include <malloc.h>

#include <cstdio>
#include <new>
#include <string>

#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace tg::train {

void KeepFreedMemoryInProcess() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

int Fail(const char* name, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", name, std::string(status.message()).c_str());
  return 1;
}

int RunMain(const char* name, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    return Fail(name, absl::InternalError(e.what()));
  } catch (const std::bad_alloc& e) {
    // A host allocation outside the tensor allocator (a std::vector of a reader or a kernel; a
    // kernel's parallel regions hand their exceptions to the calling thread) ends the run as the
    // allocator's own "out of memory" error does, not in std::terminate.
    return Fail(name, absl::ResourceExhaustedError(absl::StrCat(
                          "out of memory: a host allocation failed (", e.what(), ")")));
  }
}

}  // namespace tg::train
