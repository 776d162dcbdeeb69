/* fly-cpp native helpers: per-row reductions over llama.cpp logits (filled in by the native work). */
#include <stddef.h>

#if defined(_WIN32)
#define FLY_API __declspec(dllexport)
#else
#define FLY_API __attribute__((visibility("default")))
#endif

/* ABI version, so the Python side can refuse a stale library. */
FLY_API int fly_abi_version(void) { return 1; }
