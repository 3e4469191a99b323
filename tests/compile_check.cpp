// tests/compile_check.cpp - the same in C++ (see compile_check.c).
#include "compile_check.c"
