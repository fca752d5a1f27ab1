// The functions a CPU kernel library exports: C names, visible from the library that the cxx backend builds
// with -fvisibility=hidden, and called through ctypes.
#pragma once
#include <cstdint>

#define JITOPS_CPU_EXPORT extern "C" __attribute__((visibility("default")))
