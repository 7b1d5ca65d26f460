// A shared library with 128 KiB of static TLS. Linked into (or preloaded by)
// a test process, it gives that process more static TLS than a 100 KiB
// thread stack holds, as LibTorch 2.11 + CUDA does in mutwo-worker: glibc
// then refuses pthread_create for threads created with such small stacks
// (EINVAL), which is what made civetweb's mg_start fail.
#include <cstddef>

namespace {
thread_local char big_tls[128 * 1024];
}  // namespace

extern "C" {
// Referenced by the tests so the linker keeps the library.
char* MutwoBigTlsAddress() { return big_tls; }
size_t MutwoBigTlsBytes() { return sizeof(big_tls); }
}
