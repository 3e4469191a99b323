/* tests/onecopy/part1.cpp - file 1 of a test module (see part.h) */
#define PART 1
#include "part.h"
