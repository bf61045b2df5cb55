// Transparent huge pages for everything tcmalloc hands out. On the VMs we measure on, the first touch of a 4 KiB page
// costs ~13 us (3.3 s per GiB: the host backs the page then), so loading SD-1.5 and allocating its optimizer state
// (13 GiB) spent ~55 s of system time in page faults before the first step; 2 MiB pages take 1.25 s per GiB, 0.07 s
// when reused. Kernels in THP mode "madvise" (Debian's default) only use them where asked; mode "never" makes this a
// no-op.
#pragma once

namespace sd::cli {

// Call first thing in main(), before anything allocates much; needs tcmalloc linked in.
void use_transparent_huge_pages();

// tcmalloc gives freed memory back to the kernel bit by bit (MADV_DONTNEED) by default. A training step frees its
// activations at its end and allocates them again in the next, so every step paid the first touch of those pages
// again (the kernel clearing them). Keeping freed memory leaves the resident size at the run's peak, which is what
// a training process is sized for anyway. Needs tcmalloc linked in.
void keep_freed_memory();

}  // namespace sd::cli
