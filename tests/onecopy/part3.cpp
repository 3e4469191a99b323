/* tests/onecopy/part3.cpp - file 3 of a test module (see part.h) */
#define PART 3
#include "part.h"
