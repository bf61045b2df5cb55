// stb_image and stb_image_write compiled into the fuzz build, so the image harness's coverage and sanitizers see the
// PNG and BMP decoders (Debian's libstb, which sdtrain links, is an uninstrumented shared library). Built as Debian
// builds it: every format, no optional macros (src/io/image.cpp lets only PNG and BMP data reach it).
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image.h>
#include <stb_image_write.h>
