// Transparent huge pages for everything tcmalloc hands out. On the VMs we measure on, the first touch of a 4 KiB page
// costs ~13 us (3.3 s per GiB: the host backs the page then), so loading SD-1.5 and allocating its optimizer state
// (13 GiB) spent ~55 s of system time in page faults before the first step; 2 MiB pages take 1.25 s per GiB, 0.07 s
// when reused. Kernels in THP mode "madvise" (Debian's default) only use them where asked; mode "never" makes this a
// no-op.
#pragma once

namespace sd::cli {

// Call first thing in main(), before anything allocates much; needs tcmalloc linked in.
void use_transparent_huge_pages();

}  // namespace sd::cli
