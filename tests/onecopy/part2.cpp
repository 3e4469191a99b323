/* tests/onecopy/part2.cpp - file 2 of a test module (see part.h) */
#define PART 2
#include "part.h"
