// Function multiversioning for the CPU kernels: KILN_MULTIVERSION is 1 where a function may have
// versions per instruction set (target_clones, or target("...") overloads) that the loader picks
// once for the running CPU (ifunc). Not under TSan: clang 14 instruments the ifunc resolver, which
// the loader runs before TSan is initialized, so the program crashes before main. Files with such
// functions must not construct a std::function: clang 14 then emits no code for it and the link
// fails (see gemm.cc).
#pragma once

#if defined(__SANITIZE_THREAD__)
#define KILN_MULTIVERSION 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KILN_MULTIVERSION 0
#endif
#endif
#ifndef KILN_MULTIVERSION
#define KILN_MULTIVERSION 1
#endif

// A function compiled once per instruction set (AVX-512, AVX2, the baseline), the loader picking
// one for the running CPU; nothing where multiversioning is off.
#if KILN_MULTIVERSION
#define KILN_TARGET_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KILN_TARGET_CLONES
#endif
