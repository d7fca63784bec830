// A kernel file may be compiled in parts, side by side (engine/kernels/build.py): built with
// -DPARTS=n -DPART=i, a file instantiates only the kernel families its IN_PART(j) lines give to part i
// (j % n == i), with everything else (the templates, the small kernels) in every part; built without,
// the whole file. A first start compiles the parts on all cores at once instead of one file at a time.
#pragma once
#ifndef PARTS
#define PARTS 1
#define PART 0
#endif
#define IN_PART(j) ((j) % PARTS == PART)
