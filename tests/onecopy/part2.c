/* tests/onecopy/part2.c - file 2 of a test module (see part.h) */
#define PART 2
#include "part.h"
