#include "cli/huge_pages.h"

#include <gperftools/malloc_extension.h>
#include <sys/mman.h>

#include <algorithm>

namespace sd::cli {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Wraps tcmalloc's source of memory (sbrk or mmap) so that it returns whole, aligned 2 MiB pages and tells the kernel
// they may be backed by huge pages. tcmalloc uses all of `actual_size`, so the rounding wastes nothing.
class HugePageSystemAllocator : public SysAllocator {
 public:
  explicit HugePageSystemAllocator(SysAllocator* next) : next_(next) {}
  void* Alloc(size_t size, size_t* actual_size, size_t alignment) override {
    const size_t rounded = (size + kHugePage - 1) / kHugePage * kHugePage;
    void* p = next_->Alloc(rounded, actual_size, std::max(alignment, kHugePage));
    if (p) madvise(p, *actual_size, MADV_HUGEPAGE);
    return p;
  }

 private:
  SysAllocator* next_;
};

}  // namespace

void use_transparent_huge_pages() {
  MallocExtension* tcmalloc = MallocExtension::instance();
  static HugePageSystemAllocator allocator(tcmalloc->GetSystemAllocator());
  tcmalloc->SetSystemAllocator(&allocator);
}

void keep_freed_memory() { MallocExtension::instance()->SetMemoryReleaseRate(0); }

}  // namespace sd::cli
