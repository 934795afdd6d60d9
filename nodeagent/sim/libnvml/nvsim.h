/* The simulated libnvidia-ml.so.1's shared core (core.c), called by the generated entry points. */
#ifndef NVSIM_H
#define NVSIM_H
#include <stdint.h>
#include <string.h>

/* Every argument of an NVML call travels as a 64-bit integer holding its bytes: pointers as
 * their address, scalars and enums zero-extended. Copying bytes rather than casting also takes
 * handles declared as one-pointer structs (go-nvml's nvml.h declares them so for cgo; the
 * ABI passes them as the pointer). Anything wider than 8 bytes fails to compile. */
static inline uint64_t nvsim_bits(const void *value, size_t size) {
    uint64_t bits = 0;
    memcpy(&bits, value, size);
    return bits;
}
#define NVSIM_ARG(x) nvsim_bits(&(x), sizeof(char[sizeof(x) <= 8 ? (int)sizeof(x) : -1]))

__attribute__((visibility("hidden"))) int nvsim_call(const char *name, int argc,
                                                     const uint64_t *argv);
__attribute__((visibility("hidden"))) int nvsim_unsupported(const char *name);
#endif
